"""`IndexedRedisCache` through real LangGraph on the machine's Redis (db 9, a key prefix of the
test's own): entries are indexed under the bound subject, sync and async; nothing is cached
without a binding or for identifiers the index layout cannot tell apart."""

from __future__ import annotations

import asyncio
import os
import secrets
import unittest
from typing import TypedDict

import redis
from langgraph.graph import END, START, StateGraph
from langgraph.types import CachePolicy

from lethe_gate.cache import IndexedRedisCache, index_key, subject


class State(TypedDict):
    q: str
    a: str


def respond(state: State) -> dict:
    return {"a": f"answer to {state['q']}"}


class IndexedCacheTest(unittest.TestCase):
    def setUp(self) -> None:
        url = os.environ.get("LETHE_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
        self.r = redis.Redis.from_url(f"{url}/9")
        self.root = f"pyc{secrets.token_hex(4)}"
        self.prefix = f"{self.root}:langgraph:cache:"
        self.index = f"{self.root}:idx:{{tenant}}:{{subject}}"
        cache = IndexedRedisCache(self.r, prefix=self.prefix, index=self.index)
        g = StateGraph(State)
        g.add_node("respond", respond, cache_policy=CachePolicy())
        g.add_edge(START, "respond")
        g.add_edge("respond", END)
        self.graph = g.compile(cache=cache)

    def tearDown(self) -> None:
        keys = list(self.r.scan_iter(match=f"{self.root}:*"))
        if keys:
            self.r.unlink(*keys)

    def entries(self) -> set[bytes]:
        return set(self.r.scan_iter(match=f"{self.prefix}*"))

    def members(self, t: str, s: str) -> set[bytes]:
        return self.r.smembers(index_key(self.index, t, s))

    def test_each_subjects_entries_are_indexed_under_it_sync_and_async(self) -> None:
        with subject("acme", "alice"):
            self.graph.invoke({"q": "alice's question"})

        async def bob() -> None:
            with subject("acme", "bob"):
                await self.graph.ainvoke({"q": "bob's question"})

        asyncio.run(bob())
        alice, bob_ = self.members("acme", "alice"), self.members("acme", "bob")
        self.assertEqual(len(alice), 1)
        self.assertEqual(len(bob_), 1)
        self.assertEqual(alice | bob_, self.entries(), "every entry is indexed, under one subject")
        self.assertIn(b"alice's question", self.r.get(next(iter(alice))))

    def test_nothing_is_cached_without_a_subject_or_for_an_ambiguous_one(self) -> None:
        self.graph.invoke({"q": "nobody's"})
        with subject("acme:eu", "bob"):
            self.graph.invoke({"q": "a tenant holding the separator"})
        self.assertEqual(self.entries(), set())
        with self.assertRaises(ValueError):
            index_key(self.index, "acme:eu", "bob")
        self.assertEqual(index_key(self.index, "acme", "eu:bob"), f"{self.root}:idx:acme:eu:bob")


if __name__ == "__main__":
    unittest.main()
