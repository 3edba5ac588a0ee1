"""CPU seconds per second used by each program (all its threads), sampled from /proc over a
window: `cpu.py DELAY SECONDS` prints one JSON object {program: cores}. bench/gate/run.sh runs
it during the HTTP measurement to split a permit cycle's CPU between PostgreSQL, the server and
the clients."""
import collections
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")


def snapshot():
    used = collections.Counter()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        used[comm] += int(fields[11]) + int(fields[12])  # utime + stime, all threads
    return used


time.sleep(float(sys.argv[1]))
before, t0 = snapshot(), time.time()
time.sleep(float(sys.argv[2]))
after, dt = snapshot(), time.time() - t0
print(json.dumps({k: round((v - before.get(k, 0)) / TICK / dt, 3) for k, v in after.items() if v > before.get(k, 0)}))
