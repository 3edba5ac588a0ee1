#!/usr/bin/env python3
"""The peer's way of replaying erasures into a restored Redis: it has no recovery, so a team
re-runs the runbook's step 6 for each erased subject. Step 6 by the runbook's own code
(`runbook.step6_redis`: SCAN MATCH '<tenant>:<user>:*' COUNT 1000, UNLINK each page's keys,
until cursor 0), imported from the peer, once per subject, on one connection opened and pinged
before the clock, as runbook.py times it.

Prints JSON: {"subjects", "unlinked", "scan_calls", "seconds", "unlink_seconds"}.

Usage: step6_loop.py PEER_DIR --db 13 --tenant acme --subjects FILE (one subject a line)
Runs with the venv's python (redis-py, and the peer's imports: langgraph, psycopg).
"""
import argparse
import json
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("peer")
ap.add_argument("--db", type=int, required=True)
ap.add_argument("--tenant", required=True)
ap.add_argument("--subjects", required=True)
a = ap.parse_args()
sys.path.insert(0, os.path.abspath(a.peer))

import redis  # noqa: E402
from runbook import step6_redis  # noqa: E402  (the peer's code, not a copy)
from common import REDIS_HOST, REDIS_PORT  # noqa: E402

with open(a.subjects) as f:
    subjects = [line.strip() for line in f if line.strip()]
r = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=a.db)
r.ping()
unlinked = scans = 0
unlink_s = 0.0
s = time.perf_counter()
for user in subjects:
    out = step6_redis(r, a.tenant, user)
    unlinked += out["unlinked"]
    scans += out["scan_calls"]
    unlink_s += out["unlink_s"]
seconds = time.perf_counter() - s
print(json.dumps({"subjects": len(subjects), "unlinked": unlinked, "scan_calls": scans,
                  "seconds": seconds, "unlink_seconds": round(unlink_s, 4)}))
