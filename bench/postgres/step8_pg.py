#!/usr/bin/env python3
"""The PostgreSQL part of the runbook's step 8, alone: the peer's own `runbook.step8_verify`
with Redis stubbed out (its SCAN count of '<tenant>:<user>:*' walks all 1,000,000 keys of db 0,
which is not PostgreSQL work). Connections are opened before the clock, as runbook.py does.
Run right after runbook.py or bulk_reference.py, on the state their own step 8 saw.

Prints JSON: {"seconds", "result"}.

Usage: step8_pg.py PEER_DIR [--scenario scaled]
Needs the venv's python and LG_PG_HOST / LG_PG_PORT / LG_PG_USER (as `scripts/pg peer` sets).
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("peer")
ap.add_argument("--scenario", default="scaled")
a = ap.parse_args()
sys.path.insert(0, os.path.abspath(a.peer))

import psycopg  # noqa: E402
from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402
from langgraph.store.postgres import PostgresStore  # noqa: E402

from common import SCENARIOS, pg_uri  # noqa: E402
from runbook import step8_verify  # noqa: E402  (the peer's code, not a copy)


class NoRedis:
    """Stands in for redis.Redis: step 8's SCAN count finds nothing and costs nothing."""

    def scan_iter(self, *_a, **_kw):
        return iter(())


sc = SCENARIOS[a.scenario]
tenant, user = sc.target
uri = pg_uri(sc.db)
with PostgresSaver.from_conn_string(uri) as cp, PostgresStore.from_conn_string(uri) as store, \
        psycopg.connect(uri, autocommit=True) as conn:
    s = time.perf_counter()
    res = step8_verify(cp, store, conn, NoRedis(), tenant, user)
    sec = time.perf_counter() - s
print(json.dumps({"seconds": sec, "result": res}))
