"""Wiring the gate into a LangGraph graph. Needs ``langgraph`` (the rest of the package does not).

One :class:`Gate` per process holds, for each thread id, the lease its run took when it read
memory. Then:

- **memory read**: :meth:`Gate.take_lease` after reading store items: the lease lists each
  item's ``(memory_id, version)`` (:func:`memory_ref`), so a memory-scope erasure of one of them
  revokes it, and an erasure of another memory does not;
- **model output**: :meth:`Gate.stream_tokens` holds an ``output`` permit while tokens flow;
  on revocation it closes the model's stream, drops the tokens not yet flushed and confirms the
  cancellation;
- **tools**: :meth:`Gate.dispatch_tools` takes a ``tool`` permit per call; on revocation the
  calls not yet dispatched never run;
- **state**: :meth:`Gate.checkpointer` wraps any checkpointer so that ``put`` and ``put_writes``
  happen under a ``state`` permit and each checkpoint's metadata carries ``lethe_epoch``, ``lethe_token`` and the
  tenant and subject keys (what the database guard checks).

:meth:`Gate.run_config` makes the run config: thread id, and the tenant and subject keys (plus
``lethe_epoch`` once the thread holds a lease) in its ``metadata``, which LangGraph copies into
every checkpoint's metadata.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.store.base import Item

from .client import GateClient, Lease
from .errors import Refused

EPOCH_KEY = "lethe_epoch"
TENANT_EPOCH_KEY = "lethe_tenant_epoch"
"""The metadata key carrying the lease's epoch (the fencing token the database guard checks)."""


def item_version(updated_at: datetime) -> str:
    """A store item's version as Lethe's store adapters read it: ``updated_at`` in UTC with
    microseconds, ``2026-01-02T03:04:05.123456Z``."""
    if updated_at.tzinfo is None:
        updated_at = updated_at.replace(tzinfo=timezone.utc)
    return updated_at.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def memory_ref(item: Item, template_len: int = 2) -> tuple[str, str]:
    """``(memory_id, version)`` of a store item, as a Lethe store target names it.

    ``template_len`` is how many labels the target's ``namespace`` template has (``["{tenant}",
    "{subject}"]``: 2). The memory id is the rest of the namespace and the key joined with
    ``/``: item ``("acme", "alice", "memories") / "k42"`` is ``memories/k42``.
    """
    labels = list(item.namespace[template_len:]) + [item.key]
    return "/".join(labels), item_version(item.updated_at)


class Gate:
    """The gate's wiring for one process's graphs.

    ``tenant_key`` and ``subject_key`` name the run-metadata keys that identify the person
    (the same keys as the checkpointer target's ``metadata = { tenant = ..., subject = ... }``).
    """

    def __init__(
        self,
        client: GateClient,
        *,
        tenant_key: str = "tenant_id",
        subject_key: str = "user_id",
        template_len: int = 2,
        ttl_ms: int = 120_000,
    ) -> None:
        self.client = client
        self.tenant_key = tenant_key
        self.subject_key = subject_key
        self.template_len = template_len
        self.ttl_ms = ttl_ms
        self._lock = threading.Lock()
        self._leases: dict[str, Lease] = {}

    # ------------------------------------------------------------------ config and leases
    def run_config(self, thread_id: str, tenant: str, subject: str, **configurable: Any) -> RunnableConfig:
        """The config to run a graph with for this person on this thread."""
        metadata: dict[str, Any] = {self.tenant_key: tenant, self.subject_key: subject}
        lease = self._bound(thread_id)
        if lease is not None:
            metadata.update(lease.fencing())
        return {"configurable": {"thread_id": thread_id, **configurable}, "metadata": metadata}

    def who(self, config: RunnableConfig) -> tuple[str, str]:
        """The run's ``(tenant, subject)`` from its metadata."""
        md = config.get("metadata") or {}
        try:
            return md[self.tenant_key], md[self.subject_key]
        except KeyError:
            raise LookupError(
                f"the run config's metadata has no {self.tenant_key!r}/{self.subject_key!r}: "
                "make it with Gate.run_config"
            ) from None

    def take_lease(self, config: RunnableConfig, items: Iterable[Item]) -> Lease:
        """Takes the run's lease after it read ``items`` and binds it to the thread (a lease the
        thread held before is let go). Raises :class:`~lethe_gate.Fenced` during an erasure."""
        tenant, subject = self.who(config)
        reads = [memory_ref(i, self.template_len) for i in items]
        lease = self.client.take_lease(tenant, subject, reads, self.ttl_ms)
        with self._lock:
            old = self._leases.get(_thread(config))
            self._leases[_thread(config)] = lease
        if old is not None:
            old.close()
        return lease

    def lease(self, config: RunnableConfig) -> Lease:
        """The lease the run's thread holds."""
        lease = self._bound(_thread(config))
        if lease is None:
            raise LookupError("this thread holds no lease: read memory with Gate.take_lease first")
        return lease

    def end_run(self, thread_id: str) -> None:
        """Lets the thread's lease go (stop watching it). Call after the run returned."""
        with self._lock:
            lease = self._leases.pop(thread_id, None)
        if lease is not None:
            lease.close()

    def _bound(self, thread_id: str) -> Lease | None:
        with self._lock:
            return self._leases.get(thread_id)

    # ------------------------------------------------------------------ acceptance points
    def stream_tokens(
        self,
        config: RunnableConfig,
        tokens: Iterator[str],
        emit: Callable[[str], None],
        *,
        flush_every: int = 1,
    ) -> str:
        """Streams a model's tokens to ``emit`` under one ``output`` permit; returns the text.

        Tokens are buffered and flushed every ``flush_every`` tokens. On revocation (pushed, or
        seen before a flush) the model stream is closed, the buffered tokens are dropped, the
        permit's cancellation is confirmed and :class:`~lethe_gate.Revoked` is raised: nothing
        more reaches ``emit`` and the caller must not keep the text.
        """
        lease = self.lease(config)
        buffered: list[str] = []
        flushed: list[str] = []
        try:
            with lease.permit("output") as permit:
                for token in tokens:
                    permit.check()
                    buffered.append(token)
                    if len(buffered) >= flush_every:
                        permit.check()
                        emit("".join(buffered))
                        flushed += buffered
                        buffered.clear()
                permit.check()
                if buffered:
                    emit("".join(buffered))
                    flushed += buffered
        except BaseException:
            buffered.clear()  # never flushed, never kept
            close = getattr(tokens, "close", None)
            if close is not None:
                close()  # aborts the model's stream (a generator's finally runs now)
            raise
        return "".join(flushed)

    def dispatch_tools(
        self,
        config: RunnableConfig,
        calls: Sequence[dict[str, Any]],
        tools: dict[str, Callable[..., Any]],
    ) -> list[ToolMessage]:
        """Runs each tool call under its own ``tool`` permit, in order.

        On revocation the calls not yet dispatched are revoked: they never run, and
        the refusal (:class:`~lethe_gate.Revoked` or another :class:`~lethe_gate.Refused`) is raised
        with ``undispatched`` set to how many.
        """
        lease = self.lease(config)
        out: list[ToolMessage] = []
        for n, call in enumerate(calls):
            try:
                with lease.permit("tool") as permit:
                    permit.check()
                    result = tools[call["name"]](**call["args"])
            except Refused as e:
                e.undispatched = len(calls) - n
                raise
            out.append(ToolMessage(content=str(result), tool_call_id=call["id"], name=call["name"]))
        return out

    def put_memory(self, config: RunnableConfig, store: Any, namespace: tuple[str, ...], key: str, value: dict[str, Any], **kwargs: Any) -> None:
        """Writes a long-term memory under a ``state`` permit, with the lease's fencing tokens
        in the value (``lethe_epoch``, ``lethe_tenant_epoch``, ``lethe_token``): the carrier Lethe's database
        guard checks, so a run holding a lease from before an erasure cannot write the memory
        back even if it skips the gate. ``store`` is any LangGraph ``BaseStore``."""
        lease = self.lease(config)
        stamped = {**value, **lease.fencing()}
        with lease.permit("state"):
            store.put(namespace, key, stamped, **kwargs)

    def checkpointer(self, inner: BaseCheckpointSaver) -> GatedCheckpointer:
        """``inner`` with every write of a thread that holds a lease under a ``state`` permit."""
        return GatedCheckpointer(inner, self)


def _thread(config: RunnableConfig) -> str:
    return str((config.get("configurable") or {})["thread_id"])


class GatedCheckpointer(BaseCheckpointSaver):
    """A checkpointer whose writes take a ``state`` permit from the thread's lease.

    Each checkpoint's metadata gets ``lethe_epoch``, ``lethe_tenant_epoch``, ``lethe_token`` and the tenant and
    subject keys, so the database guard can refuse a write carrying an old epoch. A write of a
    person's thread that holds no lease yet (the run's input checkpoint, written before its
    memory read) first takes a lease that read nothing: it is gated and stamped like the others
    (without the stamp, the database guard refuses every write for a person erased before).
    Writes whose run metadata names no person pass through ungated.
    """

    def __init__(self, inner: BaseCheckpointSaver, gate: Gate) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner
        self.gate = gate

    @property
    def config_specs(self) -> list:
        return self.inner.config_specs

    def _stamp(self, lease: Lease, metadata: dict[str, Any]) -> dict[str, Any]:
        return {
            **metadata,
            **lease.fencing(),
            self.gate.tenant_key: lease.tenant,
            self.gate.subject_key: lease.subject,
        }

    def _lease(self, config, metadata=None) -> Lease | None:
        """The thread's lease; for a person's thread without one, a new lease that read
        nothing (raises :class:`~lethe_gate.Fenced` during the person's erasure)."""
        thread = _thread(config)
        lease = self.gate._bound(thread)
        if lease is not None:
            return lease
        md = {**(metadata or {}), **(config.get("metadata") or {})}
        tenant, subject = md.get(self.gate.tenant_key), md.get(self.gate.subject_key)
        if not (isinstance(tenant, str) and isinstance(subject, str)):
            return None
        who = {self.gate.tenant_key: tenant, self.gate.subject_key: subject}
        return self.gate.take_lease({"configurable": {"thread_id": thread}, "metadata": who}, [])

    # Writes: under a permit.
    def put(self, config, checkpoint, metadata, new_versions):
        lease = self._lease(config, metadata)
        if lease is None:
            return self.inner.put(config, checkpoint, metadata, new_versions)
        with lease.permit("state"):
            return self.inner.put(config, checkpoint, self._stamp(lease, metadata), new_versions)

    def put_writes(self, config, writes, task_id, task_path=""):
        lease = self._lease(config)
        if lease is None:
            return self.inner.put_writes(config, writes, task_id, task_path)
        with lease.permit("state"):
            return self.inner.put_writes(config, writes, task_id, task_path)

    async def aput(self, config, checkpoint, metadata, new_versions):
        lease = await asyncio.to_thread(self._lease, config, metadata)
        if lease is None:
            return await self.inner.aput(config, checkpoint, metadata, new_versions)
        permit = lease.permit("state")
        await asyncio.to_thread(permit.__enter__)
        try:
            r = await self.inner.aput(config, checkpoint, self._stamp(lease, metadata), new_versions)
        except BaseException as e:
            await asyncio.to_thread(permit.__exit__, type(e), e, e.__traceback__)
            raise
        await asyncio.to_thread(permit.__exit__, None, None, None)
        return r

    async def aput_writes(self, config, writes, task_id, task_path=""):
        lease = await asyncio.to_thread(self._lease, config)
        if lease is None:
            return await self.inner.aput_writes(config, writes, task_id, task_path)
        permit = lease.permit("state")
        await asyncio.to_thread(permit.__enter__)
        try:
            r = await self.inner.aput_writes(config, writes, task_id, task_path)
        except BaseException as e:
            await asyncio.to_thread(permit.__exit__, type(e), e, e.__traceback__)
            raise
        await asyncio.to_thread(permit.__exit__, None, None, None)
        return r

    # Reads and the rest: the inner checkpointer's.
    def get_tuple(self, config):
        return self.inner.get_tuple(config)

    def list(self, config, **kwargs):
        return self.inner.list(config, **kwargs)

    async def aget_tuple(self, config):
        return await self.inner.aget_tuple(config)

    def alist(self, config, **kwargs):
        return self.inner.alist(config, **kwargs)

    def delete_thread(self, thread_id):
        return self.inner.delete_thread(thread_id)

    async def adelete_thread(self, thread_id):
        return await self.inner.adelete_thread(thread_id)

    def get_next_version(self, current, channel):
        return self.inner.get_next_version(current, channel)

    def get_delta_channel_history(self, *, config, channels):
        return self.inner.get_delta_channel_history(config=config, channels=channels)

    async def aget_delta_channel_history(self, *, config, channels):
        return await self.inner.aget_delta_channel_history(config=config, channels=channels)
