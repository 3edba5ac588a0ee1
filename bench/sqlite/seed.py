#!/usr/bin/env python3
"""Seeds a LangGraph SQLite deployment for Lethe's benchmark (Python standard library only).

Writes into DIR, in LangGraph's exact SQLite schema (SqliteSaver, SqliteStore with a vector
index, see tests/fixtures/README.md for the row formats):

  checkpoints.db  tables `checkpoints`, `writes` (journal_mode=WAL, as SqliteSaver sets)
  store.db        `store`, `store_vectors`, `store_migrations`, `vector_migrations` + indexes
  app.db          the application's `thread_registry` + an index on (tenant_id, user_id)
  seed.json       the counts written (totals, target, per-thread shape) for run.py's checks

Subjects: 1,000 users in 10 tenants (t00..t09, u0000..u0999). The target t03/u0342 holds
200 threads and 2,000 store items; every other subject 20 threads and 50 items. A thread is
2 or 3 `invoke`s of the fixtures' graph (START -> respond -> summarize -> END): 4 checkpoints
and 6 writes per invoke, so ~10 checkpoints and ~15 writes per thread on average. Every thread
is in the registry and its checkpoints' metadata name its owner. Each store item has one
`store_vectors` row (field `$`, 8 float32 = 32 bytes). Deterministic (seeded).

Checkpoint and writes blobs are real msgpack, built with the structure LangGraph writes (see the
fixtures): each thread's rows are made from per-shape templates by replacing fixed-length
placeholders (user, thread id, checkpoint id, timestamp), so the msgpack stays valid.

Row order on disk: rows are inserted in time order (--layout interleaved, the default): a
thread's invokes are about two days apart and threads overlap, so one thread's rows are spread
over the file as in a live deployment. --layout grouped inserts thread by thread instead.

Usage: seed.py DIR [--seed N] [--layout interleaved|grouped] [--target-threads 200]
                   [--target-items 2000] [--threads 20] [--items 50] [--users 1000]
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import random
import sqlite3
import struct
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from msgpack_min import packb  # noqa: E402

# As in the peer LangGraph runbook's common.py (LETHE_PEER_DIR).
THREAD_NS = uuid.UUID("6f1c2a52-5a8e-4c52-9f55-0c3d3b0b1a11")
TARGET = ("t03", "u0342")

CHECKPOINTS_DDL = [
    """CREATE TABLE IF NOT EXISTS checkpoints (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                checkpoint_id TEXT NOT NULL,
                parent_checkpoint_id TEXT,
                type TEXT,
                checkpoint BLOB,
                metadata BLOB,
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
            )""",
    """CREATE TABLE IF NOT EXISTS writes (
                thread_id TEXT NOT NULL,
                checkpoint_ns TEXT NOT NULL DEFAULT '',
                checkpoint_id TEXT NOT NULL,
                task_id TEXT NOT NULL,
                task_path TEXT NOT NULL DEFAULT '',
                idx INTEGER NOT NULL,
                channel TEXT NOT NULL,
                type TEXT,
                value BLOB,
                PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
            )""",
]

STORE_DDL = [
    """CREATE TABLE IF NOT EXISTS store_migrations (
                    v INTEGER PRIMARY KEY
                )""",
    """CREATE TABLE IF NOT EXISTS store (
    -- 'prefix' represents the doc's 'namespace'
    prefix text NOT NULL,
    key text NOT NULL,
    value text NOT NULL,
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, expires_at TIMESTAMP, ttl_minutes REAL,
    PRIMARY KEY (prefix, key)
)""",
    "CREATE INDEX IF NOT EXISTS store_prefix_idx ON store (prefix)",
    """CREATE INDEX IF NOT EXISTS idx_store_expires_at ON store (expires_at)
WHERE expires_at IS NOT NULL""",
    """CREATE TABLE IF NOT EXISTS vector_migrations (
                        v INTEGER PRIMARY KEY
                    )""",
    """CREATE TABLE IF NOT EXISTS store_vectors (
    prefix text NOT NULL,
    key text NOT NULL,
    field_name text NOT NULL,
    embedding BLOB,
    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    PRIMARY KEY (prefix, key, field_name),
    FOREIGN KEY (prefix, key) REFERENCES store(prefix, key) ON DELETE CASCADE
)""",
]

APP_DDL = [
    "CREATE TABLE thread_registry (tenant_id TEXT NOT NULL, user_id TEXT NOT NULL, thread_id TEXT PRIMARY KEY)",
    "CREATE INDEX thread_registry_tenant_user_idx ON thread_registry (tenant_id, user_id)",
]

# Fixed-length placeholders, replaced per thread / per checkpoint (same byte length as the
# real values, so msgpack string headers stay right).
PH_WHO = b"QQQQQ@ZZZ"  # "u0342@t03"
PH_THREAD = b"THREAD" * 6
PH_CKPT = b"CKPTID" * 6
PH_TS = b"TS" * 16
assert len(PH_WHO) == 9 and len(PH_THREAD) == 36 and len(PH_CKPT) == 36 and len(PH_TS) == 32


def users(n: int) -> list[tuple[str, str]]:
    return [(f"t{j // 100:02d}", f"u{j:04d}") for j in range(n)]


def thread_id_for(tenant: str, user: str, i: int) -> str:
    return str(uuid.uuid5(THREAD_NS, f"{tenant}/{user}/{i}"))


def uuid6(ns: int, clock_seq: int, node: int) -> str:
    """A time-ordered UUID version 6 (as LangGraph's checkpoint ids) for a time in ns."""
    g = ns // 100 + 0x01B21DD213814000
    return (
        f"{(g >> 28) & 0xFFFFFFFF:08x}-{(g >> 12) & 0xFFFF:04x}-{0x6000 | (g & 0x0FFF):04x}-"
        f"{0x8000 | (clock_seq & 0x3FFF):04x}-{node & 0xFFFFFFFFFFFF:012x}"
    )


def thread_template(invokes: int, rnd: random.Random):
    """The rows of a thread with `invokes` invokes of the fixtures' graph, with placeholders.

    Returns (checkpoints, writes): checkpoints = [(source, step, blob)], in order (each one's
    parent is the one before); writes = [(checkpoint index, task n, task_path, idx, channel,
    type, value)].
    """
    who, thread = PH_WHO.decode(), PH_THREAD.decode()
    ident, ts = PH_CKPT.decode(), PH_TS.decode()
    ver = 0

    def version() -> str:
        nonlocal ver
        ver += 1
        return f"{ver:032d}.0.{rnd.random()}"

    cps, wr = [], []
    values: dict = {}
    versions: dict = {}
    seen: dict = {"__input__": {}}
    messages: list[str] = []
    note = ""
    step = -1
    task = 0

    def checkpoint(source: str, updated: list[str]):
        nonlocal step
        body = {
            "v": 4,
            "ts": ts,
            "id": ident,
            "channel_values": {k: v for k, v in values.items()},
            "channel_versions": dict(versions),
            "versions_seen": {k: dict(v) for k, v in seen.items()},
            "updated_channels": updated,
        }
        cps.append((source, step, packb(body)))
        step += 1
        return len(cps) - 1

    for n in range(invokes):
        msg = f"{who} says #{n} in thread {thread}"
        reply = f"assistant: noted '{msg}'"
        # input checkpoint: the input waits in __start__
        v = version()
        values.pop("branch:to:summarize", None)
        values["__start__"] = {"messages": [msg]}
        versions["__start__"] = v
        c_in = checkpoint("input", ["__start__"])
        wr.append((c_in, task, "~__pregel_pull, __start__", 0, "messages", "msgpack", packb([msg])))
        wr.append((c_in, task, "~__pregel_pull, __start__", 1, "branch:to:respond", "null", b""))
        task += 1
        # step: __start__ ran, respond is next
        v = version()
        seen["__start__"] = {"__start__": versions["__start__"]}
        values.pop("__start__")
        messages = messages + [msg]
        values = {"messages": list(messages), **({"note": note} if note else {}), "branch:to:respond": None}
        for ch in ("__start__", "messages", "branch:to:respond"):
            versions[ch] = v
        c_0 = checkpoint("loop", ["branch:to:respond", "messages"])
        note = f"turns={len(messages)}"
        wr.append((c_0, task, "~__pregel_pull, respond", 0, "messages", "msgpack", packb([reply])))
        wr.append((c_0, task, "~__pregel_pull, respond", 1, "note", "msgpack", packb(note)))
        wr.append((c_0, task, "~__pregel_pull, respond", 2, "branch:to:summarize", "null", b""))
        task += 1
        # step: respond ran, summarize is next
        v = version()
        seen["respond"] = {"branch:to:respond": versions["branch:to:respond"]}
        messages = messages + [reply]
        values = {"messages": list(messages), "note": note, "branch:to:summarize": None}
        for ch in ("messages", "branch:to:respond", "note", "branch:to:summarize"):
            versions[ch] = v
        c_1 = checkpoint("loop", ["branch:to:summarize", "messages", "note"])
        note = note + "|summarized"
        wr.append((c_1, task, "~__pregel_pull, summarize", 0, "note", "msgpack", packb(note)))
        task += 1
        # step: summarize ran, the run ends
        v = version()
        seen["summarize"] = {"branch:to:summarize": versions["branch:to:summarize"]}
        values = {"messages": list(messages), "note": note}
        for ch in ("note", "branch:to:summarize"):
            versions[ch] = v
        checkpoint("loop", ["note"])
    return cps, wr


def metadata(source: str, step: int, tenant: str, user: str) -> bytes:
    # json.dumps(..., ensure_ascii=False) with default separators, as SqliteSaver writes it.
    return json.dumps(
        {"source": source, "step": step, "parents": {}, "tenant_id": tenant, "user_id": user},
        ensure_ascii=False,
    ).encode()


def iso(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns / 1e9, dt.timezone.utc).isoformat(timespec="microseconds")


def sql_ts(ns: int) -> str:
    return dt.datetime.fromtimestamp(ns // 10**9, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir")
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=20, help="threads per non-target subject")
    ap.add_argument("--items", type=int, default=50, help="store items per non-target subject")
    ap.add_argument("--target-threads", type=int, default=200)
    ap.add_argument("--target-items", type=int, default=2000)
    ap.add_argument("--layout", choices=("interleaved", "grouped"), default="interleaved",
                    help="insertion order of checkpoints/writes: by time, threads overlapping as "
                         "in a live deployment (default), or thread by thread")
    a = ap.parse_args()

    t0 = time.perf_counter()
    os.makedirs(a.dir, exist_ok=True)
    for f in ("checkpoints.db", "store.db", "app.db"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            p = os.path.join(a.dir, f + suffix)
            if os.path.exists(p):
                os.remove(p)
    rnd = random.Random(a.seed)
    templates = {k: thread_template(k, random.Random(a.seed + k)) for k in (2, 3)}
    subjects = users(a.users)
    assert TARGET in subjects

    # ---- threads: (tenant, user, thread id, invokes), in a shuffled (interleaved) order
    threads = []
    for tenant, user in subjects:
        n = a.target_threads if (tenant, user) == TARGET else a.threads
        for i in range(n):
            threads.append((tenant, user, thread_id_for(tenant, user, i), rnd.choice((2, 3))))
    rnd.shuffle(threads)

    base_ns = int(dt.datetime(2026, 6, 1, tzinfo=dt.timezone.utc).timestamp() * 1e9)
    span_ns = 180 * 86400 * 10**9
    meta_cache: dict = {}
    counts = {"checkpoints": 0, "writes": 0, "thread_registry": 0, "store": 0, "store_vectors": 0}
    target = {"threads": 0, "checkpoints": 0, "writes": 0, "thread_registry": 0, "store": 0,
              "store_vectors": 0, "store_expired": 0}

    cp_rows, wr_rows = [], []  # (insertion key, row)
    first_seen = {}
    for order, (tenant, user, tid, k) in enumerate(threads):
        cps, wrs = templates[k]
        who = f"{user}@{tenant}".encode()
        tb = tid.encode()
        # Invoke times: a thread starts somewhere in the 180 days and is resumed after gaps of
        # about two days (exponential), so threads overlap in time as in a live deployment.
        t = base_ns + rnd.randrange(span_ns // 2)
        starts = []
        for _ in range(k):
            starts.append(t)
            t += int(rnd.expovariate(1 / (2 * 86400)) * 1e9) + 1_000_000_000
        first_seen[tid] = starts[0] if a.layout == "interleaved" else order
        node = rnd.getrandbits(48)
        seq = rnd.getrandbits(14)
        ids, times = [], []
        for j, (source, step, blob) in enumerate(cps):
            ns = starts[j // 4] + (j % 4) * 1_700_000
            times.append(ns)
            cid = uuid6(ns, seq + j, node)
            ids.append(cid)
            mk = (tenant, user, source, step)
            md = meta_cache.get(mk)
            if md is None:
                md = meta_cache[mk] = metadata(source, step, tenant, user)
            b = (blob.replace(PH_WHO, who).replace(PH_THREAD, tb)
                 .replace(PH_CKPT, cid.encode()).replace(PH_TS, iso(ns).encode()))
            key = ns if a.layout == "interleaved" else (order, j)
            cp_rows.append((key, (tid, "", cid, ids[j - 1] if j else None, "msgpack", b, md)))
        task_ids = {}
        for ci, tn, path, idx, channel, typ, value in wrs:
            tk = task_ids.get(tn)
            if tk is None:
                tk = task_ids[tn] = str(uuid.UUID(int=rnd.getrandbits(128)))
            v = value.replace(PH_WHO, who).replace(PH_THREAD, tb) if value else value
            key = times[ci] + 500_000 + idx if a.layout == "interleaved" else (order, ci, idx)
            wr_rows.append((key, (tid, "", ids[ci], tk, path, idx, channel, typ, v)))
        if (tenant, user) == TARGET:
            target["threads"] += 1
            target["checkpoints"] += len(cps)
            target["writes"] += len(wrs)
            target["thread_registry"] += 1

    # Rows go in in insertion order: time order (interleaved), or thread by thread (grouped).
    cp_rows.sort(key=lambda r: r[0])
    wr_rows.sort(key=lambda r: r[0])
    cdb = sqlite3.connect(os.path.join(a.dir, "checkpoints.db"), isolation_level=None)
    cdb.execute("PRAGMA journal_mode=WAL")
    cdb.execute("PRAGMA synchronous=OFF")
    for ddl in CHECKPOINTS_DDL:
        cdb.execute(ddl)
    cdb.execute("BEGIN")
    cdb.executemany("INSERT INTO checkpoints VALUES (?,?,?,?,?,?,?)", (r for _, r in cp_rows))
    cdb.execute("COMMIT")
    cdb.execute("BEGIN")
    cdb.executemany("INSERT INTO writes VALUES (?,?,?,?,?,?,?,?,?)", (r for _, r in wr_rows))
    cdb.execute("COMMIT")
    counts["checkpoints"], counts["writes"] = len(cp_rows), len(wr_rows)
    cdb.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    cdb.close()
    del cp_rows, wr_rows

    # ---- registry: every thread, in the order threads were first seen
    adb = sqlite3.connect(os.path.join(a.dir, "app.db"), isolation_level=None)
    for ddl in APP_DDL:
        adb.execute(ddl)
    adb.execute("BEGIN")
    adb.executemany("INSERT INTO thread_registry VALUES (?,?,?)",
                    ((t, u, tid) for t, u, tid, _ in sorted(threads, key=lambda th: first_seen[th[2]])))
    adb.execute("COMMIT")
    counts["thread_registry"] = len(threads)
    adb.close()

    # ---- store: items in (T, U, memories) and (T, U, preferences), one vector row each
    items, vecs = [], []
    now_ns = base_ns + span_ns
    topics = ["likes green tea", "lives in Lisbon", "prefers short answers", "works nights",
              "is allergic to nuts", "plays the cello", "reads in French", "has two cats"]
    for tenant, user in subjects:
        n = a.target_items if (tenant, user) == TARGET else a.items
        is_target = (tenant, user) == TARGET
        for i in range(n):
            ns_label, kp = ("memories", "m") if i % 2 == 0 else ("preferences", "p")
            prefix = f"{tenant}.{user}.{ns_label}"
            key = f"{kp}-{i // 2 + 1:04d}"
            text = f"{user} of {tenant} {topics[rnd.randrange(len(topics))]} (#{i})"
            value = json.dumps({"text": text, "n": i}, separators=(",", ":"), ensure_ascii=False).encode()
            c_ns = base_ns + rnd.randrange(span_ns)
            created = sql_ts(c_ns)
            r = rnd.random()
            if r < 0.01:  # expired, never swept (SqliteStore's sweeper is off by default)
                expires, ttl = dt.datetime.fromtimestamp(c_ns / 1e9 + 0.06, dt.timezone.utc).isoformat(sep=" ", timespec="microseconds"), 0.001
                if is_target:
                    target["store_expired"] += 1
            elif r < 0.03:  # a long TTL
                expires = dt.datetime.fromtimestamp(now_ns / 1e9 + 52560000 * 60, dt.timezone.utc).isoformat(sep=" ", timespec="microseconds")
                ttl = 52560000.0
            else:
                expires, ttl = None, None
            items.append((prefix, key, value, created, created, expires, ttl))
            h = hashlib.sha256(text.encode()).digest()
            emb = struct.pack("<8f", *(b / 255.0 - 0.5 for b in h[:8]))
            vecs.append((prefix, key, "$", emb, created, created))
            if is_target:
                target["store"] += 1
                target["store_vectors"] += 1
    sdb = sqlite3.connect(os.path.join(a.dir, "store.db"), isolation_level=None)
    sdb.execute("PRAGMA synchronous=OFF")
    for ddl in STORE_DDL:
        sdb.execute(ddl)
    sdb.execute("BEGIN")
    sdb.executemany("INSERT INTO store_migrations VALUES (?)", [(v,) for v in range(5)])
    sdb.executemany("INSERT INTO vector_migrations VALUES (?)", [(0,)])
    sdb.execute("COMMIT")
    sdb.execute("BEGIN")
    sdb.executemany("INSERT INTO store VALUES (?,?,?,?,?,?,?)", items)
    sdb.execute("COMMIT")
    sdb.execute("BEGIN")
    sdb.executemany("INSERT INTO store_vectors VALUES (?,?,?,?,?,?)", vecs)
    sdb.execute("COMMIT")
    counts["store"], counts["store_vectors"] = len(items), len(vecs)
    sdb.close()

    sizes = {f: os.path.getsize(os.path.join(a.dir, f)) for f in ("checkpoints.db", "store.db", "app.db")}
    out = {
        "seed": a.seed,
        "layout": a.layout,
        "subjects": len(subjects),
        "tenants": len({t for t, _ in subjects}),
        "target": {"tenant": TARGET[0], "subject": TARGET[1], **target},
        "totals": counts,
        "bytes": sizes,
        "seconds": round(time.perf_counter() - t0, 2),
    }
    with open(os.path.join(a.dir, "seed.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
