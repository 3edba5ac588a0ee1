"""Lineage recorded by the Python package, end to end with a real ``lethe serve``: a runtime
writes summaries into a SQLite table (a ``sql`` target) and node-cache entries into Redis
(a ``langgraph-redis-cache`` target), neither naming a subject, and records
where each came from with ``GateClient.record_lineage``. Erasing one memory version removes
exactly what was derived from it, transitively (a digest of a summary); erasing the subject
removes the rest of hers; another subject's summary stays byte for byte."""

from __future__ import annotations

import os
import secrets
import sqlite3
import unittest
from pathlib import Path

import redis

import lethe_gate

from .server import Server

REDIS = os.environ.get("LETHE_REDIS_URL", "redis://127.0.0.1:6379")
# This run's own cache prefix and index layout in db 9, so no other test's keys are seen.
TAG = secrets.token_hex(4)
PREFIX = f"lethe-test:pylin:{TAG}:"

TARGET = f"""
[[target]]
name = "node-cache"
kind = "langgraph-redis-cache"
class = "cache"
url = "{REDIS}"
db = 9
prefix = "{PREFIX}"
index = "lethe-test:pylin-idx:{TAG}:{{tenant}}:{{subject}}"
legacy = "refuse"
""" + """
[[target]]
name = "summaries"
kind = "sql"
class = "summary"
path = "app.db"
table = "summaries"
locate = "SELECT id, 1 FROM summaries WHERE tenant = :tenant AND subject = :subject"
verify = "SELECT count(*) FROM summaries WHERE tenant = :tenant AND subject = :subject"
locate_memory = "SELECT id, 1 FROM summaries WHERE tenant = :tenant AND subject = :subject AND id = :memory_id"
verify_memory = "SELECT count(*) FROM summaries WHERE tenant = :tenant AND subject = :subject AND id = :memory_id"
erase = "DELETE FROM summaries WHERE id = :locator"
"""


class LineageTest(unittest.TestCase):
    def setUp(self) -> None:
        self.server = Server(TARGET)
        self.db = Path(self.server.dir.name) / "app.db"
        with sqlite3.connect(self.db) as c:
            c.execute("CREATE TABLE summaries (id TEXT PRIMARY KEY, tenant TEXT, subject TEXT, body TEXT)")

        self.redis = redis.Redis.from_url(REDIS, db=9)

    def tearDown(self) -> None:
        self.server.stop()
        for k in self.redis.scan_iter(match=PREFIX + "*"):
            self.redis.delete(k)

    def write(self, rt: lethe_gate.GateClient, subject: str, sid: str, body: str, **lineage) -> None:
        """A runtime's write of a derived summary: lineage first (refused while an erasure
        runs), then the row."""
        rt.record_lineage("acme", subject, "summaries", sid, **lineage)
        with sqlite3.connect(self.db) as c:
            c.execute("INSERT INTO summaries VALUES (?, 'acme', NULL, ?)", (sid, body))

    def rows(self) -> list[tuple[str, str]]:
        with sqlite3.connect(self.db) as c:
            return c.execute("SELECT id, body FROM summaries ORDER BY id").fetchall()

    def test_a_memory_erasure_takes_what_was_derived_from_it_transitively_and_nothing_else(self):
        rt = self.server.client(watch=False)
        op = self.server.client(operator=True, watch=False)
        try:
            self.write(rt, "alice", "s-a1", "alice likes tea", from_memories=[("m1", "v1")])
            self.write(rt, "alice", "s-a2", "alice lives in Lyon", from_memories=[("m2", "v1")])
            self.write(rt, "alice", "s-a1x", "digest of s-a1", from_artifacts=[("summaries", "s-a1")])
            self.write(rt, "bob", "s-b1", "bob likes coffee")
            # Node-cache entries, each recorded with the memory it was computed from.
            cache = {
                f"{PREFIX}summarize:a1": ("alice", "m1", b"tea, cached"),
                f"{PREFIX}summarize:a2": ("alice", "m2", b"Lyon, cached"),
                f"{PREFIX}summarize:b1": ("bob", "m1", b"coffee, cached"),
            }
            for key, (subject, memory, value) in cache.items():
                rt.record_lineage("acme", subject, "node-cache", key, from_memories=[(memory, None)])
                self.redis.set(key, value)
            before = self.rows()
            job = op.start_job("acme", "alice", memory="m1", version="v1", ticket="T-L1")["job_id"]
            done = self.server.wait_job(op, job)
            self.assertEqual(done["certificate"]["targets"]["summaries"]["count"], 2, done)
            self.assertEqual(done["certificate"]["targets"]["node-cache"]["count"], 1, done)
            self.assertEqual(self.rows(), [r for r in before if r[0] not in ("s-a1", "s-a1x")])
            self.assertIsNone(self.redis.get(f"{PREFIX}summarize:a1"))
            self.assertEqual(self.redis.get(f"{PREFIX}summarize:a2"), b"Lyon, cached")
            self.assertEqual(self.redis.get(f"{PREFIX}summarize:b1"), b"coffee, cached")
            job = op.start_job("acme", "alice", ticket="T-L2")["job_id"]
            done = self.server.wait_job(op, job)
            self.assertEqual(done["certificate"]["targets"]["summaries"]["count"], 1, done)
            self.assertEqual(done["certificate"]["targets"]["node-cache"]["count"], 1, done)
            self.assertEqual(self.rows(), [r for r in before if r[0] == "s-b1"])
            self.assertIsNone(self.redis.get(f"{PREFIX}summarize:a2"))
            self.assertEqual(self.redis.get(f"{PREFIX}summarize:b1"), b"coffee, cached")
        finally:
            rt.close()
            op.close()

    def test_a_bad_edge_is_refused_and_nothing_stored(self):
        rt = self.server.client(watch=False)
        try:
            with self.assertRaises(lethe_gate.BadRequest):
                rt.record_lineage("acme", "alice", "nowhere", "s-1")
            with self.assertRaises(lethe_gate.BadRequest):
                rt.record_lineage("acme", "alice", "summaries", "s-1", from_artifacts=[("nowhere", "x")])
            with self.assertRaises(lethe_gate.BadRequest):
                rt.record_lineage("acme", "alice", "summaries", "")
        finally:
            rt.close()


if __name__ == "__main__":
    unittest.main()
