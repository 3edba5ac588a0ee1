"""LangGraph's node cache with Lethe's subject index. Needs ``langgraph`` and ``redis``.

LangGraph keys a node-cache entry by node and input hash (``langgraph:cache:<ns>:<hash>``), so
no pattern finds a person's entries. :class:`IndexedRedisCache` writes exactly what
``langgraph.cache.redis.RedisCache`` writes, and also adds each key to the subject's index set
(``lethe:lg-cache:{tenant}:{subject}`` by default), which a ``langgraph-redis-cache`` target
erases exactly. The subject comes from :func:`subject`, around the run::

    cache = IndexedRedisCache(redis.Redis(...))
    graph = builder.compile(checkpointer=..., cache=cache)
    with subject("acme", "alice"):
        graph.invoke(inputs, config)

Outside :func:`subject` nothing is cached: an entry nobody owns would be a legacy entry, which
the target can only flush, leave to expire or refuse.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from langgraph.cache.redis import RedisCache

DEFAULT_INDEX = "lethe:lg-cache:{tenant}:{subject}"

_current: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar(
    "lethe_cache_subject", default=None
)


@contextmanager
def subject(tenant: str, subject_id: str) -> Iterator[None]:
    """Runs the block's graph invocations on behalf of ``tenant``/``subject_id``: their cache
    entries go to that subject's index. LangGraph writes the cache from a context copied from
    the caller's, so the binding reaches it, sync and async."""
    token = _current.set((tenant, subject_id))
    try:
        yield
    finally:
        _current.reset(token)


def index_key(template: str, tenant: str, subject_id: str) -> str:
    """The index set's key, refusing identifiers that would make two subjects share it (an
    identifier holding the first character of the literal that follows its placeholder), as
    the target does."""
    parts = re.split(r"(\{tenant\}|\{subject\})", template)
    out = []
    for i, p in enumerate(parts):
        if p in ("{tenant}", "{subject}"):
            value = tenant if p == "{tenant}" else subject_id
            after = parts[i + 1] if i + 1 < len(parts) else ""
            if after and after[0] in value:
                raise ValueError(
                    f"the {p[1:-1]} holds {after[0]!r}, which the index layout {template} puts "
                    "right after it: two subjects would share an index set"
                )
            out.append(value)
        else:
            out.append(p)
    return "".join(out)


class IndexedRedisCache(RedisCache):
    """``RedisCache`` that indexes each entry under the subject bound by :func:`subject`."""

    def __init__(
        self,
        redis: Any,
        *,
        serde: Any = None,
        prefix: str = "langgraph:cache:",
        index: str = DEFAULT_INDEX,
    ) -> None:
        super().__init__(redis, serde=serde, prefix=prefix)
        if "{tenant}" not in index or "{subject}" not in index:
            raise ValueError("index must hold {tenant} and {subject}")
        self.index = index

    def set(self, mapping: Mapping[Any, tuple[Any, int | None]]) -> None:
        who = _current.get()
        if not mapping or who is None:
            return
        try:
            idx = index_key(self.index, *who)
        except ValueError:
            return  # not cached: the target could not tell this subject's set from another's
        # Not a transaction (a cluster's keys live in different slots), but ordered: the index
        # entry is written before the entry, so a crash between leaves a listed key that does
        # not exist (harmless), never an entry no index lists.
        pipe = self.redis.pipeline(transaction=False)
        for (ns, key), (value, ttl) in mapping.items():
            redis_key = self._make_key(ns, key)
            encoding, data = self.serde.dumps_typed(value)
            pipe.sadd(idx, redis_key)
            if ttl is not None:
                pipe.setex(redis_key, ttl, f"{encoding}:".encode() + data)
            else:
                pipe.set(redis_key, f"{encoding}:".encode() + data)
        try:
            pipe.execute()
        except Exception:
            pass  # as RedisCache: a cache that cannot be written is skipped, the run goes on

    async def aset(self, mapping: Mapping[Any, tuple[Any, int | None]]) -> None:
        self.set(mapping)
