#!/usr/bin/env python3
"""The second client: GETs in a loop, one at a time, on random keys from a list, until SIGTERM
(or --seconds). Writes JSON {"start_ns": [...], "lat_ns": [...], "errors": n} to OUT: each
request's start (CLOCK_MONOTONIC, comparable across processes) and its latency.

Usage: getloop.py KEYS_FILE OUT [--db 0] [--seconds 60]   (KEYS_FILE: one key per line)
Runs with the venv's python (redis-py).
"""
import argparse
import json
import random
import signal
import sys
import time
from array import array

import redis

ap = argparse.ArgumentParser()
ap.add_argument("keys")
ap.add_argument("out")
ap.add_argument("--db", type=int, default=0)
ap.add_argument("--seconds", type=float, default=60.0)
a = ap.parse_args()

with open(a.keys) as f:
    keys = [line.rstrip("\n") for line in f if line.strip()]
r = redis.Redis(host="127.0.0.1", port=6379, db=a.db)
r.ping()
stop = False


def on_term(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_term)
rng = random.Random(42)
starts, lats = array("q"), array("q")
errors = 0
now = time.monotonic_ns
deadline = now() + int(a.seconds * 1e9)
print("ready", flush=True)
while not stop:
    k = keys[rng.randrange(len(keys))]
    t0 = now()
    try:
        r.get(k)
    except redis.RedisError:
        errors += 1
    t1 = now()
    starts.append(t0)
    lats.append(t1 - t0)
    if t1 > deadline:
        break
with open(a.out, "w") as f:
    json.dump({"start_ns": starts.tolist(), "lat_ns": lats.tolist(), "errors": errors}, f)
sys.exit(0)
