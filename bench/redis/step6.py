#!/usr/bin/env python3
"""The runbook's step 6 alone, by the runbook's own code: `runbook.step6_redis` (SCAN MATCH
'<tenant>:<user>:*' COUNT 1000, UNLINK each page's keys) imported from the peer, timed the way
runbook.py times it (connection opened and pinged before the clock). With --check, also the
Redis part of the runbook's step 8 (a second SCAN counting what is left), timed separately.

Prints JSON: {"unlinked", "scan_calls", "seconds", "check_seconds", "left", "mono_start",
"mono_end", "server_scan_us"} (CLOCK_MONOTONIC around step 6, for the latency windows;
server_scan_us: Redis's own time for step 6's SCANs, from INFO commandstats before and after,
which is server-wide: nothing else sends SCAN during a benchmark run).

Usage: step6.py PEER_DIR [--db 0] [--tenant t03 --user u0342] [--check]
Runs with the venv's python (redis-py, and the peer's imports: langgraph, psycopg).
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("peer")
ap.add_argument("--db", type=int, default=0)
ap.add_argument("--tenant", default="t03")
ap.add_argument("--user", default="u0342")
ap.add_argument("--check", action="store_true")
a = ap.parse_args()
sys.path.insert(0, os.path.abspath(a.peer))

import redis  # noqa: E402
from runbook import step6_redis  # noqa: E402  (the peer's code, not a copy)
from common import REDIS_HOST, REDIS_PORT  # noqa: E402

r = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=a.db)
r.ping()


def scan_usec() -> int:
    return r.info("commandstats").get("cmdstat_scan", {}).get("usec", 0)


u0 = scan_usec()
m0 = time.monotonic()
s = time.perf_counter()
out = step6_redis(r, a.tenant, a.user)
out["seconds"] = time.perf_counter() - s
out["mono_start"], out["mono_end"] = m0, time.monotonic()
out["server_scan_us"] = scan_usec() - u0
if a.check:
    # What runbook.step8_verify does for Redis: a SCAN count of the same pattern.
    s = time.perf_counter()
    out["left"] = sum(1 for _ in r.scan_iter(match=f"{a.tenant}:{a.user}:*", count=1000))
    out["check_seconds"] = time.perf_counter() - s
print(json.dumps(out))
