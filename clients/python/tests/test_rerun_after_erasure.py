"""The example graph on PostgreSQL with Lethe's database guard installed on both targets: a
person erased once can use the agent again. Their first run after the erasure is a new thread
whose input checkpoint is written before the memory read; the gated checkpointer takes a lease
for it, so it carries the new epoch and the guard admits it (without one, the guard refuses
every write of a person erased before: LT002). The erased thread itself stays dead (LT003).

Needs PostgreSQL ($LETHE_PG15_URL); its own database, dropped at the end."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import unittest
from pathlib import Path

import psycopg
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.store.postgres import PostgresStore

from lethe_gate.langgraph import EPOCH_KEY, TENANT_EPOCH_KEY, Gate

from .server import Server, lethe_bin

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from langgraph_agent import ScriptedModel, build_graph  # noqa: E402

PG = os.environ.get("LETHE_PG15_URL", "postgres://postgres@127.0.0.1:5432/postgres")


class RerunAfterErasureTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.db = "pyclient_rerun_" + secrets.token_hex(4)
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{cls.db}"')
        cls.url = PG.rsplit("/", 1)[0] + "/" + cls.db
        with PostgresSaver.from_conn_string(cls.url) as saver:
            saver.setup()
        with PostgresStore.from_conn_string(cls.url) as store:
            store.setup()
        cls.server = Server(
            f"""
[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{cls.url}"
metadata = {{ tenant = "tenant_id", subject = "user_id" }}

[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{cls.url}"
namespace = ["{{tenant}}", "{{subject}}"]
"""
        )
        for target in ("checkpoints", "memories"):
            subprocess.run(
                [lethe_bin(), "--config", str(cls.server.config), "guard", "install", "--target", target, "--json"],
                capture_output=True,
                check=True,
            )

    @classmethod
    def tearDownClass(cls) -> None:
        cls.server.stop()
        with psycopg.connect(PG, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{cls.db}" WITH (FORCE)')

    def run_once(self, gate: Gate, saver, store, subject: str, thread: str) -> dict:
        config = gate.run_config(thread, "acme", subject)
        graph = build_graph(gate, store, ScriptedModel(), saver)
        out = graph.invoke({"messages": [HumanMessage("Weather for my trip?")]}, config)
        epochs = [c.metadata.get(EPOCH_KEY) for c in saver.list(config)]
        gate.end_run(thread)
        return {"answer": out["messages"][-1].content, "epochs": epochs}

    def snapshot(self, subject: str) -> list:
        with psycopg.connect(self.url, autocommit=True) as c:
            return c.execute(
                "SELECT thread_id, checkpoint_id, checkpoint::text, metadata::text FROM checkpoints "
                "WHERE metadata->>'user_id' = %s ORDER BY 1, 2",
                (subject,),
            ).fetchall()

    def test_a_person_erased_once_can_run_the_agent_again(self):
        client = self.server.client()
        self.addCleanup(client.close)
        op = self.server.client(operator=True, watch=False)
        self.addCleanup(op.close)
        gate = Gate(client)
        alice, bob = "alice-" + secrets.token_hex(4), "bob-" + secrets.token_hex(4)
        with PostgresSaver.from_conn_string(self.url) as saver, PostgresStore.from_conn_string(self.url) as store:
            for who in (alice, bob):
                store.put(("acme", who, "memories"), "k1", {"text": "is going to Lisbon"})
            first = self.run_once(gate, saver, store, alice, "t-" + secrets.token_hex(6))
            self.assertIn("Lisbon", first["answer"])
            # Every checkpoint of the run, its input included, carries the subject's epoch.
            e0 = first["epochs"][0]
            self.assertTrue(isinstance(e0, int) and all(e == e0 for e in first["epochs"]), first)
            self.run_once(gate, saver, store, bob, "t-" + secrets.token_hex(6))
            bob_before = self.snapshot(bob)

            job = op.start_job("acme", alice, ticket="T-" + secrets.token_hex(3))["job_id"]
            self.server.wait_job(op, job)
            self.assertEqual(self.snapshot(alice), [])

            # A new memory, written under a lease taken after the erasure: the gate's token
            # (the epoch alone is refused, a writer could copy it).
            writer = gate.run_config("t-" + secrets.token_hex(6), "acme", alice)
            gate.take_lease(writer, [])
            gate.put_memory(writer, store, ("acme", alice, "memories"), "k2", {"text": "likes sunny weather"})
            gate.end_run(writer["configurable"]["thread_id"])
            again = self.run_once(gate, saver, store, alice, "t-" + secrets.token_hex(6))
            self.assertIn("sunny", again["answer"])
            self.assertTrue(again["epochs"] and all(e == e0 + 1 for e in again["epochs"]), again)
            self.assertEqual(self.snapshot(bob), bob_before, "bob's checkpoints are unchanged")

        with psycopg.connect(self.url, autocommit=True) as c:
            unstamped = c.execute(
                "SELECT count(*) FROM checkpoints WHERE metadata->>'user_id' = %s AND NOT metadata ? %s",
                (alice, TENANT_EPOCH_KEY),
            ).fetchone()[0]
        self.assertEqual(unstamped, 0, "every checkpoint carries the tenant epoch too")

if __name__ == "__main__":
    unittest.main()
