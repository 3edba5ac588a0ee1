"""Memory scope end to end with LangGraph's real PostgresStore: the lease's (memory_id, version)
pairs come from the items as LangGraph returns them, and the erasure's tombstone comes from
Lethe's `langgraph-postgres-store` target reading the same rows. If the two spelled a version
differently, the lease that read the erased memory would not be revoked and this test fails.

Needs PostgreSQL ($LETHE_PG15_URL, default postgres://postgres@127.0.0.1:5432/postgres); each
run uses its own database, dropped at the end."""

from __future__ import annotations

import os
import secrets
import unittest

import psycopg
from langgraph.store.postgres import PostgresStore

import lethe_gate
from lethe_gate.langgraph import memory_ref

from .server import Server

PG = os.environ.get("LETHE_PG15_URL", "postgres://postgres@127.0.0.1:5432/postgres")


class PostgresStoreMemoryScopeTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.db = "pyclient_" + secrets.token_hex(4)
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{cls.db}"')
        cls.url = PG.rsplit("/", 1)[0] + "/" + cls.db
        cls.server = Server(
            f"""
[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{cls.url}"
namespace = ["{{tenant}}", "{{subject}}"]
"""
        )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{cls.db}" WITH (FORCE)')

    def test_erasing_one_memory_revokes_only_the_lease_that_read_it(self):
        with PostgresStore.from_conn_string(self.url) as store:
            store.setup()
            for subj in ("alice", "bob"):
                for k in ("k1", "k2"):
                    store.put(("acme", subj, "memories"), k, {"text": f"{subj} {k}"})
            before = {(tuple(i.namespace), i.key): (i.value, i.updated_at) for i in store.search(("acme",))}
            k1 = store.get(("acme", "alice", "memories"), "k1")
            k2 = store.get(("acme", "alice", "memories"), "k2")
            self.assertEqual(memory_ref(k2)[0], "memories/k2")

            rt = self.server.client()
            op = self.server.client(operator=True, watch=False)
            try:
                keep = rt.take_lease("acme", "alice", [memory_ref(k1)])
                gone = rt.take_lease("acme", "alice", [memory_ref(k2)])
                self.assertTrue(rt.stream_connected.wait(5))
                job = op.start_job("acme", "alice", memory="memories/k2", ticket="T-MEM")["job_id"]
                self.assertTrue(gone.revoked.wait(2), "the lease that read memories/k2 was not revoked")
                with self.assertRaises(lethe_gate.Refused):
                    with gone.permit("state"):
                        pass
                with keep.permit("state"):  # during the job
                    pass
                self.assertEqual(self.server.wait_job(op, job)["state"], "COMPLETE")
                with keep.permit("output"):  # after it
                    pass
                self.assertFalse(keep.refresh())
            finally:
                rt.close()
                op.close()

            after = {(tuple(i.namespace), i.key): (i.value, i.updated_at) for i in store.search(("acme",))}
            erased = (("acme", "alice", "memories"), "k2")
            self.assertNotIn(erased, after)
            del before[erased]
            self.assertEqual(after, before, "another memory or subject changed")


if __name__ == "__main__":
    unittest.main()
