#!/usr/bin/env python3
"""Grows the scaled scenario's target (t03/u0342) to about 100,000 rows, for the peak-memory
variant. Run after `seed.py --scenario scaled --target-only` (200 real threads, 2,000 items).

Threads: server-side copies of the target's 200 real threads, by the peer's own
`seed.clone_threads` (INSERT ... SELECT of checkpoints, blobs and writes under a new thread id,
metadata tenant_id/user_id set to the target, plus a registry row), as seed.py builds the other
989 subjects. New ids are `thread_id_for(t03, u0342, i)` for i = 200 .. THREADS-1.
Store items: with --items above 2,000, the peer's `seed.seed_store_items` writes the target's
items 0 .. ITEMS-1 through real `PostgresStore.batch` (the first 2,000 are rewritten in place).
Then `VACUUM ANALYZE` of the five tables, as seed.py ends.

Prints JSON: the target's rows per table afterwards.

Usage: grow_target.py PEER_DIR [--threads 3000] [--items 2000]
Needs the venv's python and LG_PG_HOST / LG_PG_PORT / LG_PG_USER (as `scripts/pg peer` sets).
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("peer")
ap.add_argument("--threads", type=int, default=3000)
ap.add_argument("--items", type=int, default=2000)
a = ap.parse_args()
sys.path.insert(0, os.path.abspath(a.peer))

import psycopg  # noqa: E402
from langgraph.store.postgres import PostgresStore  # noqa: E402

from common import SCENARIOS, pg_uri, thread_id_for  # noqa: E402
from seed import PARAMS, clone_threads, seed_store_items, vacuum  # noqa: E402  (the peer's code)

t0 = time.perf_counter()
sc = SCENARIOS["scaled"]
t, u = sc.target
real = PARAMS["scaled"]["target_threads"]
uri = pg_uri(sc.db)
with psycopg.connect(uri) as conn:
    tmpl = [thread_id_for(t, u, i) for i in range(real)]
    have = conn.execute("SELECT count(DISTINCT thread_id) FROM checkpoints WHERE thread_id = ANY(%s)", (tmpl,)).fetchone()[0]
    if have != real:
        sys.exit(f"the target has {have} of its {real} real threads: run seed.py --scenario scaled --target-only first")
    mapping = [(thread_id_for(t, u, i), tmpl[i % real], t, u) for i in range(real, a.threads)]
    clone_threads(conn, mapping)
if a.items > PARAMS["scaled"]["target_items"]:
    with PostgresStore.from_conn_string(uri) as store:
        seed_store_items(store, t, u, a.items)
vacuum(sc.db)
with psycopg.connect(uri) as c:
    q = """WITH th AS (SELECT thread_id FROM thread_registry WHERE tenant_id = %(t)s AND user_id = %(u)s)
           SELECT (SELECT count(*) FROM th),
                  (SELECT count(*) FROM checkpoints WHERE thread_id IN (SELECT thread_id FROM th)),
                  (SELECT count(*) FROM checkpoint_blobs WHERE thread_id IN (SELECT thread_id FROM th)),
                  (SELECT count(*) FROM checkpoint_writes WHERE thread_id IN (SELECT thread_id FROM th)),
                  (SELECT count(*) FROM store WHERE prefix = %(p)s OR left(prefix, length(%(p)s) + 1) = %(p)s || '.')"""
    n = c.execute(q, {"t": t, "u": u, "p": f"{t}.{u}"}).fetchone()
out = dict(zip(("thread_registry", "checkpoints", "checkpoint_blobs", "checkpoint_writes", "store"), n))
out["rows"] = sum(n)
out["cloned_threads"] = len(mapping)
out["seconds"] = round(time.perf_counter() - t0, 2)
print(json.dumps(out))
