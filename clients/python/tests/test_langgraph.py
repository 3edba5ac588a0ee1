"""The example graph (examples/langgraph_agent.py), real LangGraph, against a real `lethe serve`.
Ordering is controlled with events at the scripted model's and the tools' pause points, never
with sleeps."""

from __future__ import annotations

import asyncio
import secrets
import sys
import threading
import time
import unittest
from pathlib import Path

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore

import lethe_gate
from lethe_gate.langgraph import EPOCH_KEY, Gate, memory_ref

from .server import Server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from langgraph_agent import TOOLS, ScriptedModel, build_graph  # noqa: E402

WAIT_S = 5.0


class Pause:
    """Blocks the caller at point ``at`` until ``go`` is set; ``reached`` tells the test."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.reached = threading.Event()
        self.go = threading.Event()

    def __call__(self, i: int) -> None:
        if i == self.at:
            self.reached.set()
            if not self.go.wait(WAIT_S * 2):
                raise TimeoutError("the test never released the pause")


class GraphTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.server = Server()
        cls.op = cls.server.client(operator=True, watch=False)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.op.close()
        cls.server.stop()

    def setUp(self) -> None:
        self.client = self.server.client()
        self.addCleanup(self.client.close)
        self.gate = Gate(self.client)
        self.subject = "u-" + secrets.token_hex(6)
        self.thread = "t-" + secrets.token_hex(6)
        self.store = InMemoryStore()
        ns = ("acme", self.subject, "memories")
        self.store.put(ns, "k1", {"text": "is going to Lisbon"})
        self.store.put(ns, "k2", {"text": "likes sunny weather"})
        self.saver = InMemorySaver()
        self.config = self.gate.run_config(self.thread, "acme", self.subject)

    def run_graph(self, graph, out: dict) -> None:
        """Runs the graph, collecting streamed tokens; the outcome goes to ``out``."""
        out["tokens"] = []
        try:
            for mode, chunk in graph.stream(
                {"messages": [HumanMessage("Weather for my trip?")]},
                self.config,
                stream_mode=["custom", "values"],
            ):
                if mode == "custom":
                    out["tokens"].append(chunk["token"])
            out["ok"] = True
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            out["error"] = e

    def erase_subject(self) -> str:
        return self.op.start_job("acme", self.subject, ticket="T-" + secrets.token_hex(3))["job_id"]

    def test_run_completes_with_epoch_in_every_gated_checkpoint(self):
        model = ScriptedModel()
        graph = build_graph(self.gate, self.store, model, self.saver)
        out: dict = {}
        self.run_graph(graph, out)
        self.assertTrue(out.get("ok"), out.get("error"))
        self.assertIn("Lisbon", "".join(out["tokens"]))
        lease = self.gate.lease(self.config)
        # The lease lists exactly the items read.
        items = self.store.search(("acme", self.subject, "memories"))
        self.assertEqual({memory_ref(i)[0] for i in items}, {"memories/k1", "memories/k2"})
        # Every checkpoint written after the memory read carries the epoch and the person.
        stamped = [c.metadata for c in self.saver.list(self.config) if EPOCH_KEY in c.metadata]
        self.assertGreaterEqual(len(stamped), 3)  # after read_memory, plan, tools, respond
        for md in stamped:
            self.assertEqual(md[EPOCH_KEY], lease.epoch)
            self.assertEqual((md["tenant_id"], md["user_id"]), ("acme", self.subject))
        # Every permit ended: an erasure now drains at once and completes.
        self.gate.end_run(self.thread)
        self.server.wait_job(self.op, self.erase_subject())

    def test_async_run_takes_state_permits_through_aput(self):
        graph = build_graph(self.gate, self.store, ScriptedModel(), self.saver)
        out = asyncio.run(graph.ainvoke({"messages": [HumanMessage("Weather?")]}, self.config))
        self.assertIn("Lisbon", out["messages"][-1].content)
        lease = self.gate.lease(self.config)
        stamped = [c.metadata for c in self.saver.list(self.config) if EPOCH_KEY in c.metadata]
        self.assertGreaterEqual(len(stamped), 3)
        self.assertTrue(all(md[EPOCH_KEY] == lease.epoch for md in stamped))
        self.gate.end_run(self.thread)
        self.server.wait_job(self.op, self.erase_subject())

    def test_revocation_mid_stream_aborts_the_stream_and_drops_buffered_tokens(self):
        pause = Pause(at=3)
        model = ScriptedModel(pause)
        graph = build_graph(self.gate, self.store, model, self.saver)
        out: dict = {}
        runner = threading.Thread(target=self.run_graph, args=(graph, out))
        runner.start()
        self.assertTrue(pause.reached.wait(WAIT_S), "the model never reached token 3")
        lease = self.gate.lease(self.config)
        job = self.erase_subject()
        self.assertTrue(lease.revoked.wait(WAIT_S), "no revocation pushed")
        pause.go.set()  # the model yields token 3 now: it must not be emitted
        runner.join(WAIT_S)
        self.assertFalse(runner.is_alive())
        self.assertIsInstance(out.get("error"), lethe_gate.Refused, out)
        self.assertEqual(len(out["tokens"]), 3, "a token was emitted after the revocation")
        self.assertTrue(model.closed.is_set(), "the model stream was not closed")
        # No answer reached the state: the last checkpoint has no AI text.
        state = graph.get_state(self.config).values
        self.assertFalse(any(isinstance(m, AIMessage) and m.content for m in state.get("messages", [])))
        # The output permit's cancellation was confirmed: the job drains and completes.
        self.server.wait_job(self.op, job)

    def test_revocation_during_tool_dispatch_revokes_the_undispatched_tools(self):
        pause = Pause(at=0)
        ran: list[str] = []

        def weather(city: str) -> str:
            ran.append("weather")
            pause(0)  # blocks inside the first tool call
            return TOOLS["weather"](city)

        def calendar(day: str) -> str:
            ran.append("calendar")
            return TOOLS["calendar"](day)

        graph = build_graph(self.gate, self.store, ScriptedModel(), self.saver, {"weather": weather, "calendar": calendar})
        out: dict = {}
        runner = threading.Thread(target=self.run_graph, args=(graph, out))
        runner.start()
        self.assertTrue(pause.reached.wait(WAIT_S))
        lease = self.gate.lease(self.config)
        job = self.erase_subject()
        self.assertTrue(lease.revoked.wait(WAIT_S))
        pause.go.set()  # the dispatched call finishes; the next one must not start
        runner.join(WAIT_S)
        self.assertFalse(runner.is_alive())
        err = out.get("error")
        self.assertIsInstance(err, lethe_gate.Refused, out)
        self.assertEqual(ran, ["weather"])
        self.assertEqual(getattr(err, "undispatched", None), 1)
        self.assertEqual(out["tokens"], [])
        self.server.wait_job(self.op, job)

    def test_run_during_an_erasure_is_refused_before_its_first_write(self):
        # A permit held elsewhere keeps the fence closed while the graph starts.
        other = self.client.take_lease("acme", self.subject)
        held = other.permit("state").__enter__()
        job = self.erase_subject()
        self.assertTrue(other.revoked.wait(WAIT_S))
        out: dict = {}
        self.run_graph(build_graph(self.gate, self.store, ScriptedModel(), self.saver), out)
        self.assertIsInstance(out.get("error"), lethe_gate.Fenced, out)
        self.assertEqual(out["tokens"], [])
        # Refused at the input checkpoint: its lease is refused, so nothing was written.
        self.assertEqual(list(self.saver.list(self.config)), [])
        held.__exit__(lethe_gate.Revoked, lethe_gate.Revoked(), None)
        self.server.wait_job(self.op, job)


if __name__ == "__main__":
    unittest.main()


class SqliteStoreMemoryTest(unittest.TestCase):
    """A lease that read an item of a LangGraph SQLite store (the server's target: a copy of
    the fixtures `SqliteStore` wrote) is revoked by the erasure of that memory: the version the
    client records (`item_version`) is the one the store target names."""

    def test_erasing_a_memory_revokes_the_lease_that_read_it(self):
        import json
        import sqlite3
        from datetime import datetime

        from langgraph.store.base import Item

        server = Server()
        self.addCleanup(server.stop)
        op = server.client(operator=True, watch=False)
        self.addCleanup(op.close)
        client = server.client()
        self.addCleanup(client.close)
        db = sqlite3.connect(Path(server.dir.name) / "store.db")
        prefix, key, value, created, updated = db.execute(
            "SELECT prefix, key, value, created_at, updated_at FROM store "
            "WHERE prefix = 'acme.alice.memories' ORDER BY key LIMIT 1"
        ).fetchone()
        db.close()
        # As `SqliteStore` hands it over: its timestamps parsed from the stored text.
        item = Item(
            value=json.loads(value),
            key=key,
            namespace=tuple(prefix.split(".")),
            created_at=datetime.fromisoformat(created),
            updated_at=datetime.fromisoformat(updated),
        )
        gate = Gate(client)
        config = gate.run_config("t-" + secrets.token_hex(6), "acme", "alice")
        lease = gate.take_lease(config, [item])
        job = op.start_job("acme", "alice", memory=memory_ref(item)[0], ticket="T-mem")["job_id"]
        self.assertTrue(lease.revoked.wait(WAIT_S), "the lease that read the memory is revoked")
        with self.assertRaises(lethe_gate.Refused):
            with lease.permit("state"):
                pass
        deadline = time.monotonic() + WAIT_S
        while op.job(job)["state"] != "COMPLETE":
            self.assertLess(time.monotonic(), deadline, op.job(job))
            time.sleep(0.05)
