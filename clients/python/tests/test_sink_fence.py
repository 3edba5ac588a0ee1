"""The fence closes between a worker's permit and the sink's acceptance (issue 5's first fault
test, sink side). The sink is LangGraph's real PostgresStore on a database with Lethe's guard
installed (`lethe guard install`); the worker holds a `state` permit taken before the erasure,
then stops (a threading.Event, no sleep) just before `store.put`. The erasure closes the fence;
the worker goes on and writes with its lease's epoch: the database refuses it (LT001), the
worker confirms the cancellation, the job completes, and bob's items are unchanged.

Needs PostgreSQL ($LETHE_PG15_URL); its own database, dropped at the end."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import threading
import time
import unittest

import psycopg
from langgraph.store.postgres import PostgresStore

from .server import Server, lethe_bin

PG = os.environ.get("LETHE_PG15_URL", "postgres://postgres@127.0.0.1:5432/postgres")


class SinkFenceTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.db = "pyclient_sink_" + secrets.token_hex(4)
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{cls.db}"')
        cls.url = PG.rsplit("/", 1)[0] + "/" + cls.db
        with PostgresStore.from_conn_string(cls.url) as store:
            store.setup()
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

    def guard(self, *args: str) -> dict:
        out = subprocess.run(
            [lethe_bin(), "--config", str(self.server.config), "guard", *args, "--target", "memories", "--json"],
            capture_output=True,
            check=True,
        )
        return json.loads(out.stdout) if out.stdout.strip() else {}

    def fenced_owners(self) -> int:
        with psycopg.connect(self.url, autocommit=True) as c:
            return c.execute("SELECT count(*) FROM lethe_guard.subject_fence WHERE fenced").fetchone()[0]

    def test_the_sink_admits_nothing_after_the_fence_closes(self):
        self.guard("install")
        with PostgresStore.from_conn_string(self.url) as store:
            for subj in ("alice", "bob"):
                for k in ("k1", "k2"):
                    store.put(("acme", subj, "memories"), k, {"text": f"{subj} {k}"})
            bob_before = {(tuple(i.namespace), i.key): (i.value, i.updated_at) for i in store.search(("acme", "bob"))}

            rt = self.server.client()
            op = self.server.client(operator=True, watch=False)
            at_sink = threading.Event()
            go = threading.Event()
            outcome: dict = {}

            def worker() -> None:
                lease = rt.take_lease("acme", "alice", [])
                with lease.permit("state") as p:
                    at_sink.set()
                    go.wait(30)  # the pause point between the permit and the sink
                    try:
                        store.put(("acme", "alice", "memories"), "late", {"text": "written back", "lethe_epoch": lease.epoch})
                        outcome["sink"] = "admitted"
                    except psycopg.Error as e:
                        outcome["sink"] = e.sqlstate
                        p.abort()  # the work did not happen: confirm the cancellation
                outcome["permit"] = p.outcome

            t = threading.Thread(target=worker)
            try:
                t.start()
                self.assertTrue(at_sink.wait(10))
                job = op.start_job("acme", "alice", ticket="T-SINK", drain_timeout_s=60)["job_id"]
                # Wait (bounded) until the guard's fence is closed in the sink's database.
                deadline = time.monotonic() + 30
                while self.fenced_owners() == 0:
                    self.assertLess(time.monotonic(), deadline, "the guard's fence never closed")
                    time.sleep(0.01)
                go.set()
                t.join(30)
                self.assertEqual(outcome.get("sink"), "LT001", f"the sink admitted the write: {outcome}")
                self.assertEqual(outcome.get("permit"), "cancelled")
                done = self.server.wait_job(op, job)
                self.assertEqual(done["state"], "COMPLETE", done)
            finally:
                go.set()
                rt.close()
                op.close()
            self.assertEqual(list(store.search(("acme", "alice"))), [], "alice's memory is gone, the late write too")
            bob_after = {(tuple(i.namespace), i.key): (i.value, i.updated_at) for i in store.search(("acme", "bob"))}
            self.assertEqual(bob_after, bob_before, "bob's items changed")
        self.assertTrue(self.guard("status")["memories"]["installed"])

    def test_a_stale_lease_cannot_write_memory_back_after_the_erasure(self):
        """Gate.put_memory stamps the lease's epoch and the gate's token into the value; after
        an erasure the database refuses a write carrying the old epoch even from a worker that
        skips the gate, and one carrying the current epoch without a token the gate issued for
        it; a run with a fresh lease writes again."""
        from lethe_gate.langgraph import Gate

        self.guard("install")
        rt = self.server.client()
        op = self.server.client(operator=True, watch=False)
        gate = Gate(rt)
        ns = ("acme", "carol", "memories")
        try:
            with PostgresStore.from_conn_string(self.url) as store:
                cfg = gate.run_config("t-carol", "acme", "carol")
                old = gate.take_lease(cfg, [])
                gate.put_memory(cfg, store, ns, "m1", {"text": "carol likes tea"})
                self.assertEqual(store.get(ns, "m1").value["lethe_epoch"], old.epoch)
                job = op.start_job("acme", "carol", ticket="T-STALE")["job_id"]
                self.assertEqual(self.server.wait_job(op, job)["state"], "COMPLETE")
                self.assertIsNone(store.get(ns, "m1"))
                # A stale worker that skips the gate and writes with its old epoch: refused.
                with self.assertRaises(psycopg.Error) as e:
                    store.put(ns, "m1", {"text": "carol likes tea", "lethe_epoch": old.epoch})
                self.assertIn(e.exception.sqlstate, ("LT002", "LT004"))
                self.assertIsNone(store.get(ns, "m1"), "the erased memory stays gone")
                # A writer that never held a lease after the erasure but puts the current epoch
                # in: refused without the gate's token, with a made-up one, with the old lease's
                # and with a token the gate issued to another subject's lease (dave's).
                gate.end_run("t-carol")
                dave = rt.take_lease("acme", "dave", [])
                current = old.epoch + 1
                for what, token in (
                    ("no token", None),
                    ("a made-up token", f"{old.lease_id}.{'0' * 64}.{'0' * 64}"),
                    ("the stale lease's token", old.token),
                    ("another subject's lease's token", dave.token),
                ):
                    v = {"text": "carol likes tea", "lethe_epoch": current, "lethe_tenant_epoch": old.tenant_epoch}
                    if token is not None:
                        v["lethe_token"] = token
                    with self.assertRaises(psycopg.Error, msg=what) as e:
                        store.put(ns, "m1", v)
                    self.assertIn(e.exception.sqlstate, ("LT002", "LT004"), what)
                self.assertIsNone(store.get(ns, "m1"), "the erased memory stays gone")
                # A run that leased after the erasure writes again, with the gate's token.
                fresh = gate.take_lease(cfg, [])
                self.assertEqual(fresh.epoch, current)
                self.assertTrue(fresh.token.startswith(f"{fresh.lease_id}."), "the gate issues a token")
                gate.put_memory(cfg, store, ns, "m1", {"text": "carol, anew"})
                got = store.get(ns, "m1").value
                self.assertEqual((got["text"], got["lethe_token"]), ("carol, anew", fresh.token))
        finally:
            rt.close()
            op.close()


if __name__ == "__main__":
    unittest.main()
