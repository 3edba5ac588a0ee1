#!/usr/bin/env python3
"""The stale-writer fault test of Lethe's database guard, through real LangGraph.

A long-lived worker process, driven by tests/e2e/guard_stale_writer.sh through handshake files
(never sleeps), plays an agent runtime against one PostgreSQL database whose LangGraph tables
carry the guard (`lethe guard install`):

  phase A  (before the erasure) a run of acme/alice holding a lease of the current epoch (read
           from `lethe_guard`-less state: alice was never erased, so epoch 0) writes through a
           compiled StateGraph with PostgresSaver on thread T, and puts a store item K through
           PostgresStore. It keeps T's last checkpoint in memory, as a worker mid-run would.
           Everyone else's rows are snapshotted (row::text).
  phase B  (`lethe erase` is paused inside the job, after its inventory) writes for alice
           are refused (LT001) even with a current token, and any write to her inventoried
           thread T (LT003), a checkpoint naming no owner included; bob, unfenced, writes
           without a token.
  phase C  (the job is COMPLETE; leases the gate issued after it, alice's and bob's, are
           passed in: `--take-leases` runs `lethe serve` and takes them) the stale worker tries
           PostgresSaver.put and put_writes on T, continues T through the graph, starts a new
           thread and PostgresStore.put K and a new key, all with its old epoch: every one is
           refused, T and K stay gone, and no checkpoint or blob of the new stale thread exists
           (its blobs were rolled back with the refused checkpoint; its task writes are a known
           limit, counted in "known_limits"). A writer that puts the new epoch in without the
           gate's token, or with the token the gate issued to bob's lease, is refused too. A
           fresh run with alice's new lease (its epoch and the gate's token) writes a new thread
           and K again. Everyone else's rows are byte for byte as in
           phase A. bob still writes without any token.

Rows the test writes itself are on threads and keys named `guardtest-*`, outside the snapshot.
Prints one JSON result on stdout; exit 0 when every check passed.
"""
from __future__ import annotations

import argparse
import json
import operator
import sys
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

import psycopg

TENANT, ALICE, BOB = "acme", "alice", "bob"
META_KEYS = ("tenant_id", "user_id")


class ChatState(TypedDict):
    messages: Annotated[list[str], operator.add]
    note: str


def _respond(state: ChatState) -> dict:
    return {"messages": [f"assistant: noted '{state['messages'][-1]}'"], "note": "responded"}


def _summarize(state: ChatState) -> dict:
    return {"note": state.get("note", "") + "|summarized"}


def build_graph(checkpointer):
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(ChatState)
    g.add_node("respond", _respond)
    g.add_node("summarize", _summarize)
    g.add_edge(START, "respond")
    g.add_edge("respond", "summarize")
    g.add_edge("summarize", END)
    return g.compile(checkpointer=checkpointer)


def run_config(thread: str, subject: str, epoch: int | None, token: str | None = None) -> dict:
    """What a runtime passes: owner keys and, once it holds a lease, the lease's epoch and the
    gate's token for it."""
    meta = {"tenant_id": TENANT, "user_id": subject}
    if epoch is not None:
        meta["lethe_epoch"] = epoch
    if token is not None:
        meta["lethe_token"] = token
    return {"configurable": {"thread_id": thread}, "metadata": meta}


def item(text: str, epoch: int | None, token: str | None = None) -> dict:
    """A store value; the lease's epoch and token ride in the reserved keys `lethe_epoch` and
    `lethe_token`."""
    v = {"text": text}
    if epoch is not None:
        v["lethe_epoch"] = epoch
    if token is not None:
        v["lethe_token"] = token
    return v


def take_leases(config: Path, out: Path) -> int:
    """Runs `lethe serve` on the config (port 0), takes a lease for alice and one for bob as a
    runtime would, writes them to `out` as JSON and stops the server."""
    import os
    import re
    import subprocess

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "clients" / "python"))
    import lethe_gate

    proc = subprocess.Popen([os.environ["LETHE_BIN"], "--config", str(config), "serve", "--listen", "127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        url = None
        for line in proc.stdout:  # the bound address is printed once the server listens
            m = re.search(rb"(127\.0\.0\.1:\d+)", line)
            if m:
                url = "http://" + m.group(1).decode()
                break
        if url is None:
            print("lethe serve printed no address", file=sys.stderr)
            return 1
        token = (config.parent / "runtime.token").read_text().strip()
        client = lethe_gate.GateClient(url, token, watch=False)
        try:
            leases = {who: client.take_lease(TENANT, who, []) for who in (ALICE, BOB)}
            out.write_text(json.dumps({who: {"epoch": l.epoch, "tenant_epoch": l.tenant_epoch, "token": l.token}
                                       for who, l in leases.items()}))
        finally:
            client.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


def sqlstate(e: BaseException) -> str | None:
    while e is not None:
        s = getattr(e, "sqlstate", None)
        if s:
            return s
        e = e.__cause__ or e.__context__
    return None


def wait_for(path: Path) -> None:
    """Blocks until the driver creates `path` (inotify-free: a blocking FIFO read)."""
    with open(path, "r") as f:  # the driver opens the FIFO for writing when the phase may go
        f.read()


def others(conn, alice_threads: list[str]) -> list[str]:
    """Every LangGraph row that is neither alice's nor the test's own, as row::text."""
    out = []
    for t in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"):
        out += [f"{t}:{r[0]}" for r in conn.execute(
            f"SELECT x::text FROM {t} x WHERE NOT (thread_id = ANY(%s)) AND thread_id NOT LIKE 'guardtest-%%' ORDER BY 1",
            (alice_threads,))]
    for t in ("store", "store_vectors"):
        if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (t,)).fetchone()[0]:
            out += [f"{t}:{r[0]}" for r in conn.execute(
                f"SELECT x::text FROM {t} x WHERE NOT (prefix = 'acme.alice' OR starts_with(prefix, 'acme.alice.'))"
                " AND key NOT LIKE 'guardtest-%%' ORDER BY 1")]
    out += [f"thread_registry:{r[0]}" for r in conn.execute(
        "SELECT x::text FROM thread_registry x WHERE NOT (tenant_id = 'acme' AND user_id = 'alice') ORDER BY 1")]
    return out


def thread_rows(conn, thread: str) -> int:
    return sum(conn.execute(f"SELECT count(*) FROM {t} WHERE thread_id = %s", (thread,)).fetchone()[0]
               for t in ("checkpoints", "checkpoint_blobs", "checkpoint_writes"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dsn")
    ap.add_argument("--dir", type=Path, help="handshake folder (FIFOs go-b, go-c; files ready-a, ready-b, leases.json)")
    ap.add_argument("--take-leases", nargs=2, type=Path, metavar=("CONFIG", "OUT"),
                    help="instead: take alice's and bob's leases from `lethe serve` on CONFIG, into OUT")
    a = ap.parse_args()
    if a.take_leases:
        return take_leases(*a.take_leases)
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.base import create_checkpoint
    from langgraph.store.postgres import PostgresStore

    checks: list[dict] = []
    known_limits: dict = {}

    def check(name: str, ok: bool, detail=None) -> None:
        checks.append({"check": name, "ok": bool(ok), **({"detail": detail} if detail is not None else {})})
        print(("ok   " if ok else "FAIL ") + name + (f"  ({detail})" if detail is not None else ""), file=sys.stderr, flush=True)

    def refused(name: str, want: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - we want whatever LangGraph raises
            got = sqlstate(e)
            check(name, got == want, f"SQLSTATE {got}, want {want}")
            return
        check(name, False, f"admitted, want SQLSTATE {want}")

    def admitted(name: str, fn) -> None:
        try:
            fn()
        except Exception as e:  # noqa: BLE001
            check(name, False, f"refused: SQLSTATE {sqlstate(e)}: {e}")
            return
        check(name, True)

    with PostgresSaver.from_conn_string(a.dsn) as saver, \
            PostgresStore.from_conn_string(a.dsn) as store, \
            psycopg.connect(a.dsn, autocommit=True) as conn:
        app = build_graph(saver)
        alice_threads = [r[0] for r in conn.execute(
            "SELECT DISTINCT thread_id FROM checkpoints WHERE metadata->>'tenant_id' = 'acme' AND metadata->>'user_id' = 'alice'"
            " UNION SELECT thread_id FROM thread_registry WHERE tenant_id = 'acme' AND user_id = 'alice'")]
        ns_alice = (TENANT, ALICE, "memories")

        # ---------------- phase A: the worker's run, before the erasure (lease epoch 0)
        stale_epoch = 0
        T = f"stale-{uuid.uuid4()}"       # a real thread of alice's: the erasure must take it
        K = "stale-memory"
        app.invoke({"messages": ["alice: remember my tea"]}, run_config(T, ALICE, stale_epoch))
        store.put(ns_alice, K, item("alice likes green tea", stale_epoch))
        last = saver.get_tuple({"configurable": {"thread_id": T}})
        check("A: the stale worker's run wrote its thread", thread_rows(conn, T) > 0, thread_rows(conn, T))
        before = others(conn, alice_threads + [T])
        (a.dir / "ready-a").write_text("ok")

        # ---------------- phase B: the job is between FROZEN and COMPLETE
        wait_for(a.dir / "go-b")
        refused("B: graph run for alice with the stale token", "LT001",
                lambda: app.invoke({"messages": ["x"]}, run_config(f"guardtest-{uuid.uuid4()}", ALICE, stale_epoch)))
        refused("B: graph run for alice with a newer token", "LT001",
                lambda: app.invoke({"messages": ["x"]}, run_config(f"guardtest-{uuid.uuid4()}", ALICE, stale_epoch + 1)))
        # T was inventoried before this pause, and the guard records what an inventory finds as
        # erased at once: every write to T is refused as a write to an erased thread, whoever
        # it names. That includes a checkpoint whose metadata names no owner (a state update
        # made without run metadata says only {"source": "update"}): before, the guard judged
        # it by its own metadata and admitted it, and the job then blocked on
        # anomalous_volume (more rows than inventoried), so the resume below did not reach
        # COMPLETE.
        refused("B: put_writes on alice's inventoried thread", "LT003",
                lambda: saver.put_writes(last.config, [("messages", ["late"])], "task-b"))
        refused("B: update_state on alice's inventoried thread", "LT003",
                lambda: app.update_state({"configurable": {"thread_id": T}}, {"note": "late"}))
        # No new channel versions: no blob rides with it (a blob is judged by a checkpoint of
        # its thread, which names alice), only the checkpoint row and its own metadata.
        ck_b = create_checkpoint(last.checkpoint, None, last.metadata["step"] + 1)
        refused("B: PostgresSaver.put of a checkpoint naming no owner on alice's inventoried thread", "LT003",
                lambda: saver.put(last.config, ck_b, {"source": "update", "step": last.metadata["step"] + 1, "parents": {}}, {}))
        refused("B: PostgresStore.put for alice", "LT001",
                lambda: store.put(ns_alice, "guardtest-b", item("x", stale_epoch + 1)))
        admitted("B: bob, not fenced, writes without a token",
                 lambda: app.invoke({"messages": ["bob: hi"]}, run_config(f"guardtest-bob-{uuid.uuid4()}", BOB, None)))
        (a.dir / "ready-b").write_text("ok")

        # ---------------- phase C: the job is COMPLETE; the stale worker carries on
        wait_for(a.dir / "go-c")
        leases = json.loads((a.dir / "leases.json").read_text())
        fresh, bobs = leases[ALICE], leases[BOB]
        epoch = fresh["epoch"]
        check("C: the job bumped the epoch", epoch > stale_epoch and epoch == int((a.dir / "epoch").read_text()), epoch)
        check("C: the erased thread is gone", thread_rows(conn, T) == 0, thread_rows(conn, T))
        ck = create_checkpoint(last.checkpoint, None, last.metadata["step"] + 1)
        refused("C: PostgresSaver.put on the erased thread (issue 7206)", "LT003",
                lambda: saver.put(last.config, ck, {**last.metadata, "step": last.metadata["step"] + 1},
                                  dict(last.checkpoint["channel_versions"])))
        refused("C: PostgresSaver.put_writes on the erased thread (issue 7206)", "LT003",
                lambda: saver.put_writes(last.config, [("messages", ["late write"])], "task-c"))
        refused("C: the graph continues the erased thread", "LT003",
                lambda: app.invoke({"messages": ["alice: more"]}, run_config(T, ALICE, stale_epoch)))
        check("C: the erased thread stays gone", thread_rows(conn, T) == 0, thread_rows(conn, T))
        T2 = f"guardtest-stale2-{uuid.uuid4()}"
        refused("C: the stale worker starts a new thread", "LT002",
                lambda: app.invoke({"messages": ["alice: again"]}, run_config(T2, ALICE, stale_epoch)))
        refused("C: the stale worker starts a new thread without any token", "LT002",
                lambda: app.invoke({"messages": ["alice: again"]}, run_config(T2, ALICE, None)))
        cps = sum(conn.execute(f"SELECT count(*) FROM {t} WHERE thread_id = %s", (T2,)).fetchone()[0]
                  for t in ("checkpoints", "checkpoint_blobs"))
        orphans = conn.execute("SELECT count(*) FROM checkpoint_writes WHERE thread_id = %s", (T2,)).fetchone()[0]
        check("C: no checkpoint or blob of the refused new thread exists (blobs rolled back with it)", cps == 0, cps)
        # Known limit (README): task writes LangGraph puts before the thread's first
        # checkpoint cannot be attributed, so they are admitted; no checkpoint names them, so
        # LangGraph never reads them back. Reported, not hidden.
        known_limits["orphan_task_writes_of_refused_new_thread"] = orphans
        refused("C: PostgresStore.put of the erased item", "LT004",
                lambda: store.put(ns_alice, K, item("alice likes green tea", stale_epoch)))
        refused("C: PostgresStore.put of a new key", "LT002",
                lambda: store.put(ns_alice, "guardtest-new", item("x", stale_epoch)))
        # A writer that never held a lease after the erasure puts the current epoch in: without
        # the gate's token, or with the one the gate issued to bob's lease, it is refused.
        for what, token in (("without the gate's token", None), ("with bob's lease's token", bobs["token"])):
            refused(f"C: a new thread with the current epoch {what}", "LT002",
                    lambda: app.invoke({"messages": ["alice: forged"]},
                                       run_config(f"guardtest-forged-{uuid.uuid4()}", ALICE, epoch, token)))
            refused(f"C: PostgresStore.put of the erased item with the current epoch {what}", "LT004",
                    lambda: store.put(ns_alice, K, item("alice likes green tea", epoch, token)))
            refused(f"C: PostgresStore.put of a new key with the current epoch {what}", "LT002",
                    lambda: store.put(ns_alice, "guardtest-forged", item("x", epoch, token)))
        check("C: the erased item stays gone", store.get(ns_alice, K) is None)
        after = others(conn, alice_threads + [T])
        changed = sorted(set(before) ^ set(after))
        check("C: every other subject's row byte for byte", not changed and len(before) == len(after),
              f"{len(before)} rows; {len(changed)} differ")

        # A fresh run under alice's new lease (its epoch and the gate's token) writes again.
        T3 = f"guardtest-fresh-{uuid.uuid4()}"
        admitted("C: a fresh run with the new lease writes a new thread",
                 lambda: app.invoke({"messages": ["alice: hello again"]}, run_config(T3, ALICE, epoch, fresh["token"])))
        check("C: the fresh thread is there", thread_rows(conn, T3) > 0, thread_rows(conn, T3))
        admitted("C: a fresh run writes the erased key again",
                 lambda: store.put(ns_alice, K, item("alice now likes coffee", epoch, fresh["token"])))
        got = store.get(ns_alice, K)
        check("C: the fresh item is there", got is not None and got.value.get("text") == "alice now likes coffee")
        admitted("C: bob writes without a token",
                 lambda: store.put((TENANT, BOB, "memories"), "guardtest-c", item("bob", None)))

    ok = all(c["ok"] for c in checks)
    print(json.dumps({"ok": ok, "checks": checks, "known_limits": known_limits}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
