#!/usr/bin/env python3
"""The database guard's overhead on LangGraph's own writes, with the real graph.

    bench/guard/run.sh [--url postgres://postgres@127.0.0.1:5432/postgres] [--rounds 8] [--ops 60]

One fresh database: PostgresSaver.setup() and PostgresStore.setup(), background data for 200
subjects written through the graph, then `lethe guard install` for both targets, and guard
state of a deployment that has been erasing for a while (1,000 erased threads, 1,000 erased
items, 200 erased subjects with open fences, one closed fence of another subject).

Then rounds, alternating the order (ABBA), on the same database and connections:
  - guard ON: the triggers enabled; guard OFF: `ALTER TABLE ... DISABLE TRIGGER USER` (the guard's triggers)
    (what runs on a write is then exactly what runs without the guard installed; the state
    stays, so every ON round sees the same tables).
  - checkpoint workload: one `graph.invoke` of a compiled StateGraph (START -> respond ->
    summarize -> END) with PostgresSaver on a new thread, `durability="sync"` so every
    checkpoint, blob and task write is on the timed path; config metadata carries tenant_id,
    user_id, lethe_epoch, lethe_tenant_epoch and lethe_token, as a gate-integrated runtime sends. One invoke writes 4
    checkpoints, their blobs and the task writes.
  - store workload: one `PostgresStore.put` of a new key with the same keys in the value.
With `--baseline-lethe BIN`, a second database of the same shape gets the guard that BIN installs
(an older version's, say), and its rounds are interleaved with the first's, so both versions'
overheads come from one run under the same load.
Reports per version, workload and condition: median and p99 per operation, and the overhead of
the medians. JSON to bench/out/guard-<UTC>.json; a Markdown table on stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import operator
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Annotated, TypedDict

import psycopg

ROOT = Path(__file__).resolve().parents[2]


class S(TypedDict):
    messages: Annotated[list[str], operator.add]
    note: str


def build_graph(saver):
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(S)
    g.add_node("respond", lambda s: {"messages": [f"assistant: noted '{s['messages'][-1]}'"], "note": "r"})
    g.add_node("summarize", lambda s: {"note": s.get("note", "") + "|s"})
    g.add_edge(START, "respond")
    g.add_edge("respond", "summarize")
    g.add_edge("summarize", END)
    return g.compile(checkpointer=saver)


# What a gate-integrated runtime adds to each checkpoint's metadata and each store value: the
# lease's epochs and the gate's token (`<lease>.<64 hex>.<64 hex>`). The timed subjects were
# never erased, so the guard admits them on its first probe without reading the token.
FENCING = {"lethe_epoch": 0, "lethe_tenant_epoch": 0, "lethe_token": "1." + "a" * 64 + "." + "b" * 64}


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def setup(a, url: str, db: str, lethe: str):
    """A fresh database `db` with LangGraph's tables, 200 background subjects, the guard of
    `lethe` installed and the state of a deployment that has been erasing for a while. Returns
    (dsn, work folder)."""
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.store.postgres import PostgresStore

    base = url.rsplit("/", 1)[0]
    dsn = f"{base}/{db}"
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {db}")
    work = Path(f"/tmp/{db}")
    work.mkdir(exist_ok=True)
    (work / "lethe.toml").write_text(f'''[control]
journal = "sqlite:journal.db"
[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{dsn}"
metadata = {{ tenant = "tenant_id", subject = "user_id" }}
[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{dsn}"
namespace = ["{{tenant}}", "{{subject}}"]
''')
    with PostgresSaver.from_conn_string(dsn) as saver, PostgresStore.from_conn_string(dsn) as store, \
            psycopg.connect(dsn, autocommit=True) as conn:
        saver.setup()
        store.setup()
        app = build_graph(saver)
        print(f"seeding 200 subjects in {db} ...", file=sys.stderr, flush=True)
        for i in range(200):
            u = f"u{i:04d}"
            app.invoke({"messages": [f"{u} hello"]}, {"configurable": {"thread_id": f"bg-{u}"},
                       "metadata": {"tenant_id": "t", "user_id": u}}, durability="sync")
            store.put(("t", u, "memories"), "m0", {"text": f"{u} likes tea"})
        for tgt in ("checkpoints", "memories"):
            subprocess.run([lethe, "--config", str(work / "lethe.toml"), "guard", "install", "--target", tgt, "--json"],
                           check=True, capture_output=True)
        if a.guard_sql:
            subprocess.run(["psql", dsn, "-q", "-1", "-v", "ON_ERROR_STOP=1", "-f", a.guard_sql],
                           check=True, capture_output=True)
        # Version 7 keys its digests: its functions take the key row first (an older guard's
        # do not), so one run.py times either version.
        keyed = conn.execute("SELECT to_regclass('lethe_guard.key') IS NOT NULL").fetchone()[0]
        k = "(SELECT kr FROM lethe_guard.key kr), " if keyed else ""
        conn.execute(f"""
            INSERT INTO lethe_guard.erased_thread SELECT lethe_guard.thread_digest({k}'erased-' || g) FROM generate_series(1, 1000) g;
            INSERT INTO lethe_guard.erased_item SELECT lethe_guard.item_digest({k}'t.gone' || g, 'k'), 2, false FROM generate_series(1, 1000) g;
            INSERT INTO lethe_guard.subject_fence SELECT lethe_guard.subject_owner({k}'t', 'gone' || g), 2, false FROM generate_series(1, 200) g;
        """)
        if not a.at_rest:
            conn.execute(f"INSERT INTO lethe_guard.subject_fence VALUES (lethe_guard.subject_owner({k}'t', 'being-erased'), 3, true)")
        # What autovacuum would have done by now; this machine's PostgreSQL 15 runs with it
        # off, and without statistics the planner reads the guard's tables sequentially.
        conn.execute("VACUUM ANALYZE")
        version = conn.execute("SELECT value FROM lethe_guard.meta WHERE key = 'version'").fetchone()[0]
    return dsn, version


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default=os.environ.get("LETHE_PG15_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--ops", type=int, default=60, help="operations per workload per round")
    ap.add_argument("--lethe", default=os.environ.get("LETHE_BIN", str(ROOT / "target/release/lethe")))
    ap.add_argument("--baseline-lethe", metavar="BIN",
                    help="also time the guard another lethe binary installs (say, an older version's), in a "
                         "second database of the same shape, its rounds interleaved with the first's: both "
                         "versions' overheads from the same run, under the same load")
    ap.add_argument("--at-rest", action="store_true",
                    help="no fence closed during the rounds (a deployment between erasures); by default one "
                         "subject's fence is closed, as while an erasure runs")
    ap.add_argument("--guard-sql", help="after `lethe guard install`, run this install.sql over it (psql, one "
                    "transaction): times another version of the guard's functions without a rebuild, "
                    "e.g. `git show REV:crates/adapters/src/postgres_guard/install.sql`")
    a = ap.parse_args()
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.store.postgres import PostgresStore

    load_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    bins = [a.lethe] + ([a.baseline_lethe] if a.baseline_lethe else [])
    dbs = [f"lethe_guard_bench_{os.getpid()}_{i}" for i in range(len(bins))]
    samples: dict = {}
    versions = []
    try:
        dsns = []
        for db, b in zip(dbs, bins):
            dsn, v = setup(a, a.url, db, b)
            dsns.append(dsn)
            versions.append(v)
        with contextlib.ExitStack() as stack:
            runs = []
            for dsn, v in zip(dsns, versions):
                saver = stack.enter_context(PostgresSaver.from_conn_string(dsn))
                store = stack.enter_context(PostgresStore.from_conn_string(dsn))
                conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
                runs.append((v, build_graph(saver), store, conn))
            tables = ["checkpoints", "checkpoint_blobs", "checkpoint_writes", "store"]

            def set_guard(conn, on: bool):
                for t in tables:
                    # USER: lethe_guard and, from version 5, lethe_guard_reown (no other user
                    # trigger is on LangGraph's tables).
                    conn.execute(f"ALTER TABLE {t} {'ENABLE' if on else 'DISABLE'} TRIGGER USER")

            for v, _, _, _ in runs:
                for w in ("checkpoint", "store"):
                    for on in (True, False):
                        samples[(v, w, on)] = []
            n = 0
            # warm-up, both conditions
            for v, app, store, conn in runs:
                for on in (True, False):
                    set_guard(conn, on)
                    for _ in range(10):
                        n += 1
                        app.invoke({"messages": ["warm"]}, {"configurable": {"thread_id": f"w-{n}"},
                                   "metadata": {"tenant_id": "t", "user_id": "u0001", **FENCING}}, durability="sync")
                        store.put(("t", "u0001", "memories"), f"w-{n}", {"text": "warm", **FENCING})
            for r in range(a.rounds):
                order = (True, False) if r % 2 == 0 else (False, True)
                # The versions' turns alternate too (ABBA across versions as within each).
                for v, app, store, conn in (runs if r % 2 == 0 else runs[::-1]):
                    for on in order:
                        set_guard(conn, on)
                        for i in range(a.ops):
                            n += 1
                            u = f"u{n % 200:04d}"
                            cfg = {"configurable": {"thread_id": f"run-{n}-{uuid.uuid4()}"},
                                   "metadata": {"tenant_id": "t", "user_id": u, **FENCING}}
                            t0 = time.perf_counter()
                            app.invoke({"messages": [f"{u} says {i}"]}, cfg, durability="sync")
                            samples[(v, "checkpoint", on)].append((time.perf_counter() - t0) * 1000)
                            t0 = time.perf_counter()
                            store.put(("t", u, "memories"), f"k-{n}", {"text": f"{u} memory {i}", **FENCING})
                            samples[(v, "store", on)].append((time.perf_counter() - t0) * 1000)
                print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
            for _, _, _, conn in runs:
                set_guard(conn, True)
            server = runs[0][3].execute("SHOW server_version").fetchone()[0]
    finally:
        with psycopg.connect(a.url, autocommit=True) as admin:
            for db in dbs:
                admin.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
    load_after = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    res = {"server": server, "guard_sql": a.guard_sql, "fence_closed": not a.at_rest, "rounds": a.rounds, "ops_per_round": a.ops, "load_before": load_before,
           "load_after": load_after, "nproc": os.cpu_count(), "versions": versions, "results": {}}
    print(f"\nPostgreSQL {server}; {a.rounds} rounds x {a.ops} ops per condition (ABBA); "
          f"{'no fence closed (at rest)' if a.at_rest else 'one fence closed'}; load before: {load_before}; after: {load_after}\n")
    print("| guard version | workload | guard | median ms | p99 ms | overhead (medians) |")
    print("|---|---|---|---|---|---|")
    for v in versions:
        for w in ("checkpoint", "store"):
            off, on = samples[(v, w, False)], samples[(v, w, True)]
            mo, mn = statistics.median(off), statistics.median(on)
            res["results"].setdefault(v, {})[w] = {"off": {"median_ms": mo, "p99_ms": pct(off, 99), "n": len(off)},
                                                   "on": {"median_ms": mn, "p99_ms": pct(on, 99), "n": len(on)},
                                                   "overhead_pct": (mn / mo - 1) * 100}
            label = "graph.invoke (4 checkpoints + blobs + writes)" if w == "checkpoint" else "PostgresStore.put"
            print(f"| {v} | {label} | off | {mo:.2f} | {pct(off, 99):.2f} | |")
            print(f"| {v} | {label} | on | {mn:.2f} | {pct(on, 99):.2f} | {(mn / mo - 1) * 100:+.1f}% |")
    out = ROOT / "bench/out"
    out.mkdir(exist_ok=True)
    (out / f"guard-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json").write_text(json.dumps(res, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
