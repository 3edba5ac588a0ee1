#!/usr/bin/env python3
"""Issue 4's benchmark on Redis: Lethe's `redis` target against the runbook's step 6 and a
redis-cli floor, a second client's GET latency during the erase, and index mode at three
keyspace sizes.

Part 1, scan mode, in Redis db 0 (the peer's scaled keyspace: 1,000,000 keys, 5,000 of them
t03/u0342's). N times, rotating which goes first, each after re-writing the target's 5,000 keys
(the peer's own `seed.redis_user_cmds`, the commands seed.py sends for the target):
  lethe  `lethe --config X -v erase --tenant t03 --subject u0342 ... --json`, one `redis` target
         (pattern "{tenant}:{subject}:*", mode scan), in each --scan-variants configuration:
         the whole job, journal in a fresh folder
  step6  the runbook's step 6 by its own code (step6.py imports runbook.step6_redis), timed
         in-process as runbook.py times it; then, separately, its step 8's Redis SCAN count
  floor  `redis-cli -n 0 --scan --pattern 't03:u0342:*' | xargs redis-cli -n 0 unlink`
Part 2, latency: a second client (getloop.py, redis-py, one GET at a time on random non-target
keys) runs through a quiet window and then through an erase; p99 in each window.
Part 3, index mode, in three scratch dbs (default 12, 13, 14; they must be empty and are
flushed at the end): filler keys in seed.py's layout, so that each db holds 100,000, 1,000,000
or 5,000,000 keys with the target's 5,000; the runs alternate between the sizes, and before
each the target's keys and the index set idx:t03:u0342 (SADD of its keys) are re-written; then
lethe with mode = "index".
Every run is checked: the target's keys are gone, DBSIZE fell by exactly what was erased, and a
DUMP digest of a sample of the other keys is unchanged.
Writes bench/out/redis-<UTC time>.json and prints Markdown tables.

Lethe runs in named configurations (VARIANTS: extra lines of the target's table; --variant
NAME='LINE;LINE' adds one): `lethe` (the defaults), `lethe_frozen` (verify = "frozen"), ...
--scan-variants picks those of part 1, --lat-variants those of part 2 besides lethe and
lethe_frozen. --scan-db N runs parts 1 and 2 in db N, seeded with its own scaled keyspace (the
peer's seed_redis_users) and flushed at the end, away from other users of db 0.

Usage: run.py --peer DIR [--runs 5] [--lat-rounds 5] [--sizes 100000,1000000,5000000]
              [--scratch-dbs 12,13,14] [--scan-db 0] [--skip scan,latency,index] [--lethe PATH]
              [--scan-variants A,B] [--lat-variants A,B] [--variant NAME=LINES]
              [--index-journal fresh|kept] [--workdir DIR --keep]
Runs with the venv's python (scripts/pg python): redis-py and the peer's imports.
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "bench", "out")
TENANT, SUBJECT = "t03", "u0342"
N_TARGET = 5000
TIME = "/usr/bin/time"
PATTERN = f"{TENANT}:{SUBJECT}:*"

CONFIG = """# Written by bench/redis/run.py
[control]
journal = "sqlite:journal.db"
key_file = "lethe.key"
policy_version = "bench-redis-1"
certificates = "certificates"

[[target]]
name = "session-cache"
kind = "redis"
class = "cache"
url = "redis://127.0.0.1:6379/{db}"
pattern = "{{tenant}}:{{subject}}:*"
{mode}
"""
MODE_SCAN = 'mode = "scan"'
# Lethe's scan-mode configurations, by name: extra lines of the target's table.
VARIANTS = {
    "lethe": "",                                  # the defaults: verify = "scan", scan_count = 100
    "lethe_frozen": 'verify = "frozen"',          # one keyspace pass; the scan left to verify --audit
    "lethe_frozen_c1000": 'verify = "frozen"\nscan_count = 1000',  # fewest round trips
    "lethe_c1000": "scan_count = 1000",           # the default before 2026-12-02
    "lethe_paced": 'verify = "frozen"\nscan_count = 200\nscan_pause_ms = 1',  # a pause after each page
}
MODE_INDEX = 'mode = "index"\nindex = "idx:{tenant}:{subject}"'

# Filler keys for the index-mode keyspaces, in seed.py's layout for the other subjects
# (<tenant>:<user>:llmcache:<n> strings, every tenth a <tenant>:<user>:session:<n> hash), never
# the target's. Written server-side, FILL_CHUNK keys per EVAL.
FILL_LUA = """
local a, b = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = a, b - 1 do
  local j = i % 999
  if j >= 342 then j = j + 1 end
  local t = string.format('t%02d', math.floor(j / 100))
  local u = string.format('u%04d', j)
  if i % 10 == 0 then
    redis.call('HSET', t .. ':' .. u .. ':session:' .. string.format('%07d', i), 'user', u, 'tenant', t, 'last', tostring(i))
  else
    redis.call('SET', t .. ':' .. u .. ':llmcache:' .. string.format('%07d', i), u .. ' cached completion #' .. i .. ' ................................')
  end
end
return b - a
"""
FILL_CHUNK = 100_000


def filler_key(i: int) -> str:
    j = i % 999
    if j >= 342:
        j += 1
    t, u = f"t{j // 100:02d}", f"u{j:04d}"
    return f"{t}:{u}:session:{i:07d}" if i % 10 == 0 else f"{t}:{u}:llmcache:{i:07d}"


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-800:]}")
    return p.stdout


def timed(cmd: list[str], cwd: str) -> tuple[float, int, str, str, int, float, float]:
    """Wall seconds, peak RSS KiB, stdout, stderr, exit code, monotonic start and end."""
    fd, tf = tempfile.mkstemp(prefix="time-")
    os.close(fd)
    m0 = time.monotonic()
    t0 = time.perf_counter()
    p = subprocess.run([TIME, "-o", tf, "-f", "%M"] + cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    m1 = time.monotonic()
    with open(tf) as f:
        rss = int(f.read().split()[-1])
    os.remove(tf)
    return wall, rss, p.stdout, p.stderr, p.returncode, m0, m1


def phases(stderr: str, started: float) -> dict:
    """Seconds per phase of a one-target job, from `lethe -v` log timestamps (UTC)."""
    marks = []
    for line in stderr.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        m = re.match(r"^(\S+)Z\s+INFO\s+(.*?)\s+job=", line)
        if m:
            ts = dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.timezone.utc).timestamp()
            marks.append((m.group(2), ts))

    def at(msg):
        return next((ts for mm, ts in marks if mm.startswith(msg)), None)

    req, fence, inv = at("Job requested"), at("Fence closed"), at("Inventory taken")
    er, done = at("Target erased"), at("Job complete")
    if None in (req, fence, inv, er, done):
        return {}
    p = {"start_to_request": req - started, "freeze": fence - req, "inventory": inv - fence,
         "erase": er - inv, "verify_and_certificate": done - er, "job": done - req}
    return {k: round(v, 4) for k, v in p.items()}


def buckets(r, db: int) -> int | None:
    """The main hash table's bucket count of db, from MEMORY STATS (Redis 7.0's formula: 40 bytes a
    key plus 8 a bucket, both tables counted while a rehash runs); None if the formula does not fit."""
    stats = r.memory_stats().get(f"db.{db}") or {}
    main = stats.get("overhead.hashtable.main")
    if main is None:
        return None
    rest = main - r.dbsize() * 40
    return rest // 8 if rest > 0 and rest % 8 == 0 else None


def wait_for_rehash(rss: dict, limit_s: float = 180.0) -> dict:
    """Waits until no scratch db is in the middle of a rehash. Filling a db past a power of two
    doubles its table, and Redis then moves the buckets over in small steps for tens of seconds,
    looking every key up in both tables meanwhile: 5,000 lookups then cost Redis 3-6x more. A
    keyspace at rest is not rehashing, so the runs wait for that. Returns how long it took per
    size; a size whose bucket count cannot be read is reported and not waited for."""
    out, t0 = {}, time.perf_counter()
    pending = dict(rss)
    while pending:
        for size, rs in list(pending.items()):
            n = buckets(rs, rs.connection_pool.connection_kwargs["db"])
            if n is None or n & (n - 1) == 0:  # unknown, or one table (a power of two)
                out[str(size)] = {"seconds": round(time.perf_counter() - t0, 1),
                                  "buckets": n, "known": n is not None}
                del pending[size]
        if pending and time.perf_counter() - t0 > limit_s:
            for size in pending:
                out[str(size)] = {"seconds": None, "buckets": None, "known": True, "timed_out": True}
            break
        if pending:
            time.sleep(0.5)
    log("rehash: " + ", ".join(f"{k} keys {v['seconds']} s" + ("" if v["known"] else " (bucket count unknown)")
                              for k, v in out.items()))
    return out


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine(r) -> dict:
    mem = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) // 1024
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    info = r.info("server")
    return {"nproc": os.cpu_count(), "cpu": cpu, "mem_mib": mem, "kernel": platform.release(),
            "python": platform.python_version(), "redis": info.get("redis_version"),
            "redis_cli": sh(["redis-cli", "--version"]).split()[-1]}


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else {}


def pct(sorted_xs: list[int], p: float) -> float:
    if not sorted_xs:
        return float("nan")
    return sorted_xs[max(0, math.ceil(p / 100 * len(sorted_xs)) - 1)]


class Recorder:
    """Stands in for a redis-py pipeline to learn the keys seed.redis_user_cmds writes."""

    def __init__(self):
        self.keys = []

    def _k(self, key, *_a, **_kw):
        self.keys.append(key)

    set = hset = rpush = sadd = _k


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", required=True, help="the peer runbook's folder")
    ap.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres",
                    help="for `scripts/pg peer ... seed.py` when db 0 is not the scaled keyspace")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--lat-rounds", type=int, default=5)
    ap.add_argument("--lat-c100-rounds", type=int, default=3,
                    help="latency rounds of each --lat-variants configuration (information)")
    ap.add_argument("--lat-variants", default="lethe_c1000,lethe_paced",
                    help="Lethe configurations measured in the latency part besides lethe and lethe_frozen")
    ap.add_argument("--scan-variants", default="lethe,lethe_frozen,lethe_frozen_c1000",
                    help="Lethe configurations timed in the scan part")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=LINES: define or redefine a Lethe configuration (lines separated by ';')")
    ap.add_argument("--index-runs", type=int, default=5)
    ap.add_argument("--sizes", default="100000,1000000,5000000")
    ap.add_argument("--index-journal", choices=["fresh", "kept"], default="fresh",
                    help="index mode: a fresh journal and key for every run (start-up included), or one "
                         "kept per size across its runs, as a deployment keeps its journal")
    ap.add_argument("--scan-db", type=int, default=0,
                    help="db for the scan and latency parts; other than 0, a private scaled keyspace seeded "
                         "at the start by the peer's seed_redis_users and flushed at the end, so that other "
                         "users of db 0 cannot disturb the runs")
    ap.add_argument("--scratch-dbs", default="12,13,14",
                    help="one empty db per size, flushed at the end (never 0, 1 or 9)")
    ap.add_argument("--lethe", default=os.path.join(REPO, "target", "release", "lethe"))
    ap.add_argument("--lethe-commit")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: scan,latency,index")
    ap.add_argument("--awake", action="store_true",
                    help="keep every CPU busy with a nice-19 spinner during the whole run (see the README: "
                         "on this VM an idle CPU makes each localhost round trip ~3x slower)")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    for v in a.variant:
        name, _, lines = v.partition("=")
        VARIANTS[name] = lines.replace(";", "\n")
    lat_variants = [v for v in a.lat_variants.split(",") if v]
    scan_variants = [v for v in a.scan_variants.split(",") if v]
    for v in lat_variants + scan_variants:
        if v not in VARIANTS:
            sys.exit(f"unknown Lethe configuration {v}: one of {', '.join(VARIANTS)} or --variant {v}=...")
    if a.awake:
        import atexit
        spinners = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
                    for _ in range(os.cpu_count() or 1)]

        def stop_spinners():
            for p in spinners:
                p.kill()
                p.wait()
        atexit.register(stop_spinners)

    peer = os.path.abspath(a.peer)
    sys.path.insert(0, peer)
    import redis  # noqa: E402
    from seed import redis_user_cmds  # noqa: E402  (the peer's code: the keys seed.py writes)

    sizes = [int(x) for x in a.sizes.split(",")]
    scratch = [int(x) for x in a.scratch_dbs.split(",")]
    if len(scratch) < len(sizes) or len(set(scratch)) != len(scratch) or set(scratch) & {0, 1, 9}:
        sys.exit("--scratch-dbs: one distinct db per size, never 0 (the scaled keyspace), 1 (the small scenario) or 9")
    lethe = os.path.abspath(a.lethe)
    if not os.access(lethe, os.X_OK):
        sys.exit(f"no lethe binary at {lethe}")
    py = sys.executable
    r0 = redis.Redis(host="127.0.0.1", port=6379, db=0)
    if a.scan_db in scratch or a.scan_db in (1, 9):
        sys.exit("--scan-db: not a scratch db, not 1 or 9")
    rS = redis.Redis(host="127.0.0.1", port=6379, db=a.scan_db)
    rss = {size: redis.Redis(host="127.0.0.1", port=6379, db=db) for size, db in zip(sizes, scratch)}
    for size, r_ in rss.items():
        if "index" not in skip and r_.dbsize() != 0:
            sys.exit(f"scratch db {r_.connection_pool.connection_kwargs['db']} holds {r_.dbsize()} keys; "
                     "pick empty ones (--scratch-dbs)")
    work = a.workdir or tempfile.mkdtemp(prefix="lethe-bench-redis-")
    os.makedirs(work, exist_ok=True)
    t_start = time.perf_counter()
    load_before = loadavg()
    uptime_before = sh(["uptime"]).strip()
    log(f"work folder: {work}; load average before: {load_before}")

    rec = Recorder()
    redis_user_cmds(rec, TENANT, SUBJECT, N_TARGET, True)
    target_keys = [k if isinstance(k, str) else k.decode() for k in rec.keys]
    assert len(target_keys) == len(set(target_keys)) == N_TARGET

    def write_target(r, index: str | None = None):
        pipe = r.pipeline(transaction=False)
        for k in target_keys:        # no leftovers of an earlier run: same values every time
            pipe.unlink(k)
        redis_user_cmds(pipe, TENANT, SUBJECT, N_TARGET, True)
        if index:
            pipe.unlink(index)
            for s in range(0, N_TARGET, 1000):
                pipe.sadd(index, *target_keys[s:s + 1000])
        pipe.execute()

    def exists_count(r, keys) -> int:
        pipe = r.pipeline(transaction=False)
        for s in range(0, len(keys), 1000):
            pipe.exists(*keys[s:s + 1000])
        return sum(pipe.execute())

    def digest(r, keys) -> str:
        pipe = r.pipeline(transaction=False)
        for k in keys:
            pipe.dump(k)
        h = hashlib.sha1()
        for k, v in zip(keys, pipe.execute()):
            h.update(k.encode() + b"\0" + (v or b""))
        return h.hexdigest()

    def scan_count(r, match: str) -> int:
        return sum(1 for _ in r.scan_iter(match=match, count=10_000))

    def server_usec() -> dict:
        cs = rS.info("commandstats")
        return {c: (cs.get(f"cmdstat_{c}", {}).get("calls", 0), cs.get(f"cmdstat_{c}", {}).get("usec", 0))
                for c in ("scan", "sscan", "exists", "unlink")}

    def run_lethe(db: int, mode: str, run_dir: str) -> dict:
        os.makedirs(run_dir, exist_ok=True)
        cs0 = server_usec()
        cfg = os.path.join(run_dir, "lethe.toml")
        with open(cfg, "w") as f:
            f.write(CONFIG.format(db=db, mode=mode))
        started = time.time()
        wall, rss, out, err, rc, m0, m1 = timed(
            [lethe, "--config", cfg, "-v", "erase", "--tenant", TENANT, "--subject", SUBJECT,
             "--basis", "gdpr-art17", "--ticket", "BENCH-1", "--drain-timeout", "0", "--json"], run_dir)
        res = {"wall_s": wall, "peak_rss_kib": rss, "exit": rc, "m0": m0, "m1": m1, "problems": []}
        cs1 = server_usec()
        # Redis's own time for the commands Lethe sent (INFO commandstats is server-wide, but
        # nothing else here sends these commands during a run).
        res["server"] = {c: {"calls": cs1[c][0] - cs0[c][0], "usec": cs1[c][1] - cs0[c][1]} for c in cs0}
        res["server_ms"] = sum(v["usec"] for v in res["server"].values()) / 1000
        try:
            j = json.loads(out)
            res["state"] = j.get("state")
            res["certificate_counts"] = {k: v["count"] for k, v in (j.get("certificate") or {}).get("targets", {}).items()}
            if j.get("state") != "COMPLETE":
                res["problems"].append(f"state {j.get('state')} ({j.get('blocked_reason')})")
            if not (j.get("certificate") or {}).get("signature"):
                res["problems"].append("certificate unsigned")
        except ValueError:
            res["problems"].append(f"no JSON (exit {rc}): {err[-500:]}")
        res["phases_s"] = phases(err, started)
        return res

    # ------------------------------------------------------------------ db 0: the scaled keyspace
    result: dict = {"benchmark": "redis", "runs_requested": a.runs, "awake": a.awake, "scan_db": a.scan_db,
                    "index_journal": a.index_journal}
    runs, lat = [], []
    pooled: dict = {}  # eraser -> (quiet latencies, during latencies) of all its rounds
    if not ({"scan", "latency"} <= skip):
        if a.scan_db == 0:
            n_target = exists_count(r0, target_keys)
            others = r0.dbsize() - n_target
            if others != 1_000_000 - N_TARGET:
                log(f"db 0 holds {others} keys besides the target's, not 995,000: seeding the peer's scaled "
                    "scenario (seed.py --scenario scaled; also rewrites PostgreSQL db lg)")
                sh([os.path.join(REPO, "scripts", "pg"), "peer", a.pg_url, "seed.py", "--scenario", "scaled"])
                others = r0.dbsize() - exists_count(r0, target_keys)
        else:
            # The scaled scenario's Redis part, by the peer's own seed_redis_users and plan: the
            # target's 5,000 keys, then the other users' keys up to 1,000,000. (seed.py also
            # writes LangGraph's cache keys for the threads it runs through a real graph; here
            # those few are user keys too.)
            from seed import PARAMS, seed_redis_users  # noqa: E402
            from common import SCENARIOS  # noqa: E402
            if rS.dbsize() != 0:
                sys.exit(f"--scan-db {a.scan_db} holds {rS.dbsize()} keys; pick an empty db")
            t = time.perf_counter()
            sc = SCENARIOS["scaled"]
            total = PARAMS["scaled"]["redis_total"]
            seed_redis_users(rS, [(TENANT, SUBJECT, N_TARGET, True)])
            others_users = [x for x in sc.users if x != sc.target]
            base, extra = divmod(total - rS.dbsize(), len(others_users))
            seed_redis_users(rS, [(t_, u_, base + (1 if j < extra else 0), False) for j, (t_, u_) in enumerate(others_users)])
            others = rS.dbsize() - exists_count(rS, target_keys)
            log(f"db {a.scan_db}: the scaled keyspace ({rS.dbsize()} keys) seeded in {time.perf_counter() - t:.1f} s")
            if others != 1_000_000 - N_TARGET:
                sys.exit(f"db {a.scan_db} holds {others} other keys, not 995,000")
        r0 = rS  # from here on, the scan and latency parts use the scan db
        # One full SCAN: a 1% sample of the other keys (as verify.py picks it) for the digest,
        # and string keys for the GET client.
        sample, gets = [], []
        for k in r0.scan_iter(count=10_000):
            k = k.decode()
            if k.startswith(f"{TENANT}:{SUBJECT}:"):
                continue
            if int(hashlib.sha1(k.encode()).hexdigest()[:4], 16) % 100 == 0:
                sample.append(k)
                if ":llmcache:" in k and len(gets) < 5000:
                    gets.append(k)
        sample.sort()
        base_digest = digest(r0, sample)
        keys_file = os.path.join(work, "get-keys.txt")
        with open(keys_file, "w") as f:
            f.write("\n".join(gets) + "\n")
        log(f"db 0: {others} other keys; digest sample {len(sample)} keys; GET client on {len(gets)} keys")
        result["db0"] = {"other_keys": others, "sample_keys": len(sample), "get_keys": len(gets)}

        def check_db0(what_erased: int | None) -> list[str]:
            problems = []
            left = scan_count(r0, PATTERN)
            if left:
                problems.append(f"{left} target keys left")
            if r0.dbsize() != others:
                problems.append(f"dbsize {r0.dbsize()} != {others}")
            if digest(r0, sample) != base_digest:
                problems.append("digest of the other keys' sample changed")
            if what_erased is not None and what_erased != N_TARGET:
                problems.append(f"erased {what_erased}, expected {N_TARGET}")
            return problems

        def erase_db0(what: str, run_dir: str) -> dict:
            os.makedirs(run_dir, exist_ok=True)
            if what in VARIANTS:
                res = run_lethe(a.scan_db, MODE_SCAN + "\n" + VARIANTS[what], run_dir)
                # How long each SCAN kept Redis from serving anyone else.
                sc = res["server"]["scan"]
                res["server_scan_calls"] = sc["calls"]
                res["server_scan_us_per_call"] = sc["usec"] / sc["calls"] if sc["calls"] else None
                res["server_scan_ms"] = sc["usec"] / 1000
                cc = res.get("certificate_counts", {})
                if cc and cc != {"session-cache": N_TARGET}:
                    res["problems"].append(f"certificate counts {cc}")
                return res
            if what == "step6":
                wall, rss, out, err, rc, m0, m1 = timed([py, os.path.join(HERE, "step6.py"), peer, "--db", str(a.scan_db), "--check"], run_dir)
                res = {"wall_s": wall, "peak_rss_kib": rss, "exit": rc, "m0": m0, "m1": m1, "problems": []}
                try:
                    j = json.loads(out)
                    res.update(step6_s=j["seconds"], check_s=j["check_seconds"], erased=j["unlinked"], scan_calls=j["scan_calls"],
                               server_scan_ms=j["server_scan_us"] / 1000)
                    res["m0"], res["m1"] = j["mono_start"], j["mono_end"]  # step 6 itself, not Python's start-up
                    if j["left"]:
                        res["problems"].append(f"step 8 count {j['left']}")
                except (ValueError, KeyError):
                    res["problems"].append(f"no JSON (exit {rc}): {err[-500:]}")
                return res
            # the floor, as written in the issue
            wall, rss, out, err, rc, m0, m1 = timed(
                ["bash", "-c", f"redis-cli -n {a.scan_db} --scan --pattern '{PATTERN}' | xargs redis-cli -n {a.scan_db} unlink"], run_dir)
            res = {"wall_s": wall, "peak_rss_kib": rss, "exit": rc, "m0": m0, "m1": m1, "problems": []}
            try:
                res["erased"] = sum(int(x) for x in out.split())
            except ValueError:
                res["problems"].append(f"unexpected output: {out[-300:]} {err[-300:]}")
            return res

        # Warm the binary and the interpreter (not timed).
        subprocess.run([lethe, "--help"], capture_output=True)
        if "scan" not in skip:
            for i in range(a.runs):
                kinds = scan_variants + ["step6", "floor"]
                for what in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
                    run_dir = os.path.join(work, f"scan-{i + 1}-{what}")
                    write_target(r0)
                    rec_ = {"run": i + 1, "what": what, "load_before": loadavg()}
                    problems = []
                    if r0.dbsize() != others + N_TARGET:
                        problems.append(f"dbsize before {r0.dbsize()} != {others + N_TARGET}")
                    res = erase_db0(what, run_dir)
                    rec_["load_after"] = loadavg()
                    problems += res.pop("problems") + check_db0(res.get("erased", N_TARGET) if what not in VARIANTS else None)
                    rec_.update({k: v for k, v in res.items() if k not in ("m0", "m1")}, ok=not problems, problems=problems)
                    runs.append(rec_)
                    extra = f"  (step 6 in-process {res['step6_s']:.3f} s, step 8 count {res['check_s']:.3f} s)" if what == "step6" and "step6_s" in res else ""
                    log(f"scan run {i + 1} {what:6s} {res['wall_s']:7.3f} s  rss {res['peak_rss_kib'] / 1024:5.1f} MiB  "
                        f"{'ok' if not problems else 'FAILED: ' + '; '.join(problems)}{extra}")
                    if not a.keep:
                        shutil.rmtree(run_dir, ignore_errors=True)

        # -------------------------------------------------------------- the GET client's p99
        if "latency" not in skip:
            lw = [r["wall_s"] for r in runs if r["what"] == "lethe" and r["ok"]]
            quiet = max(2.0, statistics.median(lw) if lw else 2.5)
            for i in range(max(a.lat_rounds, a.lat_c100_rounds)):
                kinds = ["lethe", "lethe_frozen", "step6"]
                kinds = (kinds[i % 3:] + kinds[:i % 3]) if i < a.lat_rounds else []
                for what in kinds + (lat_variants if i < a.lat_c100_rounds else []):
                    run_dir = os.path.join(work, f"lat-{i + 1}-{what}")
                    os.makedirs(run_dir, exist_ok=True)
                    write_target(r0)
                    lat_out = os.path.join(run_dir, "lat.json")
                    cl = subprocess.Popen([py, os.path.join(HERE, "getloop.py"), keys_file, lat_out, "--db", str(a.scan_db)],
                                          stdout=subprocess.PIPE, text=True)
                    cl.stdout.readline()  # "ready"
                    time.sleep(0.3)
                    q0 = time.monotonic()
                    time.sleep(quiet)
                    q1 = time.monotonic()
                    res = erase_db0(what, run_dir)
                    time.sleep(0.2)
                    cl.send_signal(signal.SIGTERM)
                    cl.wait(timeout=30)
                    with open(lat_out) as f:
                        d = json.load(f)
                    qs, qe = int(q0 * 1e9), int(q1 * 1e9)
                    es, ee = int(res["m0"] * 1e9), int(res["m1"] * 1e9)
                    base = sorted(l for s, l in zip(d["start_ns"], d["lat_ns"]) if qs <= s < qe)
                    dur = sorted(l for s, l in zip(d["start_ns"], d["lat_ns"]) if es <= s < ee)
                    pooled.setdefault(what, ([], []))
                    pooled[what][0].extend(base)
                    pooled[what][1].extend(dur)
                    problems = res.pop("problems") + check_db0(res.get("erased", N_TARGET) if what in ("step6", "floor") else None)
                    if d["errors"]:
                        problems.append(f"{d['errors']} GET errors")

                    def summ(xs):
                        return {"n": len(xs), "p50_ms": pct(xs, 50) / 1e6, "p99_ms": pct(xs, 99) / 1e6,
                                "p999_ms": pct(xs, 99.9) / 1e6, "max_ms": (xs[-1] / 1e6) if xs else float("nan")}

                    row = {"round": i + 1, "eraser": what, "quiet_window_s": q1 - q0, "erase_window_s": res["m1"] - res["m0"],
                           "quiet": summ(base), "during": summ(dur), "ok": not problems, "problems": problems,
                           "load": loadavg()}
                    row["p99_ratio"] = row["during"]["p99_ms"] / row["quiet"]["p99_ms"]
                    lat.append(row)
                    log(f"latency round {i + 1} {what:6s}: p99 quiet {row['quiet']['p99_ms']:.3f} ms (n={len(base)}), "
                        f"during {row['during']['p99_ms']:.3f} ms (n={len(dur)}), ratio {row['p99_ratio']:.2f}"
                        f"{'' if not problems else '  FAILED: ' + '; '.join(problems)}")
                    if not a.keep:
                        shutil.rmtree(run_dir, ignore_errors=True)
        write_target(r0)  # leave db 0 as seed.py made it
        if a.scan_db != 0:
            rS.flushdb()
            log(f"db {a.scan_db} (the copy) flushed")

    # ------------------------------------------------------------------ index mode, scratch db
    idx_runs, fills = [], []
    if "index" not in skip:
        index_key = f"idx:{TENANT}:{SUBJECT}"
        fsamples = {}
        try:
            # One db per size, all filled first, so that the runs can alternate between sizes
            # (a slow minute of the machine then falls on every size alike).
            for size, rs in rss.items():
                fill = rs.register_script(FILL_LUA)
                want, filled = size - N_TARGET, 0
                t = time.perf_counter()
                while filled < want:
                    n = min(FILL_CHUNK, want - filled)
                    fill(args=[filled, filled + n])
                    filled += n
                step = max(1, filled // 2000)
                sample = [filler_key(i) for i in range(0, filled, step)]
                fsamples[size] = (filled, sample, digest(rs, sample))
                fills.append({"size": size, "db": rs.connection_pool.connection_kwargs["db"], "filler": filled,
                              "seconds": round(time.perf_counter() - t, 2)})
                log(f"db {fills[-1]['db']}: {filled} filler keys (+ {N_TARGET} target keys per run), filled in {fills[-1]['seconds']} s")
            mem = rss[sizes[0]].info("memory")
            fills.append({"redis_used_memory_mib": round(mem["used_memory"] / 2**20, 1)})
            fills.append({"rehash_wait": wait_for_rehash(rss)})
            for i in range(a.index_runs):
                order = sizes[i % len(sizes):] + sizes[:i % len(sizes)]
                for size in order:
                    rs = rss[size]
                    filled, fsample, fdigest = fsamples[size]
                    run_dir = os.path.join(work, f"index-{size}" + ("" if a.index_journal == "kept" else f"-{i + 1}"))
                    write_target(rs, index_key)
                    problems = []
                    if rs.dbsize() != size + 1:
                        problems.append(f"dbsize before {rs.dbsize()} != {size + 1}")
                    rec_ = {"size": size, "run": i + 1, "load_before": loadavg()}
                    res = run_lethe(rs.connection_pool.connection_kwargs["db"], MODE_INDEX, run_dir)
                    rec_["load_after"] = loadavg()
                    problems += res.pop("problems")
                    cc = res.get("certificate_counts", {})
                    if cc != {"session-cache": N_TARGET + 1}:  # the keys and the index set
                        problems.append(f"certificate counts {cc}, expected {N_TARGET + 1}")
                    if exists_count(rs, target_keys + [index_key]):
                        problems.append("target keys or the index set left")
                    if rs.dbsize() != filled:
                        problems.append(f"dbsize {rs.dbsize()} != {filled}")
                    if digest(rs, fsample) != fdigest:
                        problems.append("digest of the filler sample changed")
                    res.pop("m0"), res.pop("m1")
                    rec_.update(res, ok=not problems, problems=problems)
                    idx_runs.append(rec_)
                    ph = res.get("phases_s", {})
                    log(f"index {size:>9,} run {i + 1}: {res['wall_s'] * 1000:6.1f} ms  rss {res['peak_rss_kib'] / 1024:5.1f} MiB  "
                        f"job {ph.get('job', float('nan')) * 1000:5.1f} ms, erase {ph.get('erase', float('nan')) * 1000:5.1f} ms  "
                        f"{'ok' if not problems else 'FAILED: ' + '; '.join(problems)}")
                    if not a.keep and a.index_journal == "fresh":
                        shutil.rmtree(run_dir, ignore_errors=True)
        finally:
            for rs in rss.values():
                rs.flushdb()
            log(f"scratch dbs {a.scratch_dbs} flushed")

    load_after = loadavg()
    # ------------------------------------------------------------------ summary
    def ok(what):
        return [r for r in runs if r["what"] == what and r["ok"]]

    lw = stats([r["wall_s"] for r in ok("lethe")])
    lfw = stats([r["wall_s"] for r in ok("lethe_frozen")])
    lfph = {}
    lr = stats([r["peak_rss_kib"] / 1024 for r in ok("lethe")] + [r["peak_rss_kib"] / 1024 for r in ok("lethe_frozen")])
    scan_us = stats([r["server_scan_us_per_call"] for r in ok("lethe") if r.get("server_scan_us_per_call")])
    scan_calls = stats([r["server_scan_calls"] for r in ok("lethe") if r.get("server_scan_calls")])
    s6 = stats([r["step6_s"] for r in ok("step6")])
    # Redis's own SCAN time per run: what one keyspace pass costs the server whatever the client.
    scan_ms = {w: stats([r["server_scan_ms"] for r in ok(w) if r.get("server_scan_ms") is not None])
               for w in scan_variants + ["step6"]}
    s6c = stats([r["step6_s"] + r["check_s"] for r in ok("step6")])
    s6w = stats([r["wall_s"] for r in ok("step6")])
    fw = stats([r["wall_s"] for r in ok("floor")])
    ph_keys = ["start_to_request", "inventory", "erase", "verify_and_certificate", "job"]
    lph = {k: statistics.median(r["phases_s"][k] for r in ok("lethe") if r["phases_s"]) for k in ph_keys} if ok("lethe") else {}
    lfph = {k: statistics.median(r["phases_s"][k] for r in ok("lethe_frozen") if r["phases_s"]) for k in ph_keys} if ok("lethe_frozen") else {}
    lat_sum = {}
    for what in ["lethe", "lethe_frozen", "step6"] + lat_variants:
        rows = [r for r in lat if r["eraser"] == what and r["ok"]]
        if rows:
            lat_sum[what] = {"p99_quiet_ms": stats([r["quiet"]["p99_ms"] for r in rows]),
                             "p99_during_ms": stats([r["during"]["p99_ms"] for r in rows]),
                             "p99_ratio": stats([r["p99_ratio"] for r in rows]),
                             "p50_quiet_ms": stats([r["quiet"]["p50_ms"] for r in rows]),
                             "p50_during_ms": stats([r["during"]["p50_ms"] for r in rows]),
                             "max_during_ms": stats([r["during"]["max_ms"] for r in rows]),
                             "erase_window_s": stats([r["erase_window_s"] for r in rows])}
            q, d_ = sorted(pooled[what][0]), sorted(pooled[what][1])
            lat_sum[what]["pooled"] = {"quiet_n": len(q), "during_n": len(d_),
                                       "quiet_p99_ms": pct(q, 99) / 1e6, "during_p99_ms": pct(d_, 99) / 1e6,
                                       "quiet_p50_ms": pct(q, 50) / 1e6, "during_p50_ms": pct(d_, 50) / 1e6,
                                       "p99_ratio": pct(d_, 99) / pct(q, 99)}
    idx_sum = {}
    for size in sorted({r["size"] for r in idx_runs}):
        rows = [r for r in idx_runs if r["size"] == size and r["ok"]]
        if rows:
            idx_sum[size] = {"wall_ms": stats([r["wall_s"] * 1000 for r in rows]),
                             "job_ms": stats([r["phases_s"]["job"] * 1000 for r in rows if r["phases_s"]]),
                             "erase_ms": stats([r["phases_s"]["erase"] * 1000 for r in rows if r["phases_s"]]),
                             "inventory_ms": stats([r["phases_s"]["inventory"] * 1000 for r in rows if r["phases_s"]]),
                             "verify_ms": stats([r["phases_s"]["verify_and_certificate"] * 1000 for r in rows if r["phases_s"]]),
                             "start_ms": stats([r["phases_s"]["start_to_request"] * 1000 for r in rows if r["phases_s"]]),
                             "peak_rss_mib": stats([r["peak_rss_kib"] / 1024 for r in rows]),
                             "redis_server_ms": stats([r["server_ms"] for r in rows]),
                             "exists_us_per_call": stats([r["server"]["exists"]["usec"] / r["server"]["exists"]["calls"]
                                                          for r in rows if r["server"]["exists"]["calls"]])}
    failed = [r for r in runs + idx_runs + lat if not r["ok"]]
    walls = [v["wall_ms"]["median"] for v in idx_sum.values()]
    def judged(measured, ok):  # None: not measured in this invocation (a part skipped)
        return bool(ok()) if measured else None

    lethe_configs = [v for k, v in lat_sum.items() if k != "step6"]
    verdict = {
        "scan_within_1_2x_floor": judged(lw and fw, lambda: lw["median"] <= 1.2 * fw["median"]),
        "scan_faster_than_runbook_step6": judged(lw and s6, lambda: lw["median"] < s6["median"]),
        "scan_frozen_within_1_2x_floor": judged(lfw and fw, lambda: lfw["median"] <= 1.2 * fw["median"]),
        "scan_frozen_faster_than_runbook_step6": judged(lfw and s6, lambda: lfw["median"] < s6["median"]),
        "get_p99_within_2x": judged(lat_sum.get("lethe"), lambda: lat_sum["lethe"]["pooled"]["p99_ratio"] <= 2.0
                                    and lat_sum["lethe"]["p99_ratio"]["median"] <= 2.0),
        "get_p99_within_2x_any_configuration": judged(lethe_configs, lambda: any(
            v["pooled"]["p99_ratio"] <= 2.0 and v["p99_ratio"]["median"] <= 2.0 for v in lethe_configs)),
        "index_at_most_50ms": judged(walls, lambda: max(walls) <= 50.0),
        "index_flat": judged(walls, lambda: max(walls) <= 1.25 * min(walls)),
        "all_runs_checked_ok": not failed,
    }
    result.update({
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": a.lethe_commit or (
            sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).strip()
            + ("-dirty" if sh(["git", "-C", REPO, "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"]).strip() else "")),
        "lethe_binary": {"path": lethe, "version": sh([lethe, "--version"]).strip(),
                         "mtime_utc": dt.datetime.fromtimestamp(os.path.getmtime(lethe), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "machine": machine(r0), "load_before": load_before, "load_after": load_after,
        "uptime_before": uptime_before, "uptime_after": sh(["uptime"]).strip(),
        "variants": VARIANTS,
        "scan": {"lethe_wall_s": lw, "lethe_peak_rss_mib": lr, "lethe_phases_median_s": lph,
                 "lethe_frozen_wall_s": lfw, "lethe_frozen_phases_median_s": lfph,
                 "ratio_lethe_frozen_over_floor": lfw["median"] / fw["median"] if lfw and fw else None,
                 "ratio_lethe_frozen_over_step6": lfw["median"] / s6["median"] if lfw and s6 else None,
                 "step6_in_process_s": s6, "step6_plus_step8_count_s": s6c, "step6_process_wall_s": s6w,
                 "floor_wall_s": fw, "lethe_server_scan_us_per_call": scan_us, "lethe_server_scan_calls": scan_calls,
                 "server_scan_ms": scan_ms,
                 "ratio_lethe_over_floor": lw["median"] / fw["median"] if lw and fw else None,
                 "ratio_lethe_over_step6": lw["median"] / s6["median"] if lw and s6 else None,
                 "ratio_lethe_over_step6_plus_count": lw["median"] / s6c["median"] if lw and s6c else None},
        "latency": lat_sum, "index": {"fills": fills, "by_size": idx_sum},
        "verdict": verdict, "total_seconds": round(time.perf_counter() - t_start, 1),
        "runs": runs, "latency_rounds": lat, "index_runs": idx_runs,
    })
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"redis-{result['date_utc'].replace(':', '')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if not a.keep and not a.workdir:
        shutil.rmtree(work, ignore_errors=True)

    def mm(s, unit="s", k=3):
        return f"{s['median']:.{k}f} {unit} ({s['min']:.{k}f}-{s['max']:.{k}f})" if s else "n/a"

    m = result["machine"]
    md = [f"Run {result['date_utc']} (commit {result['git']}); {m['nproc']} CPUs ({m['cpu']}), {m['mem_mib']} MiB RAM, "
          f"Redis {m['redis']}{'; CPUs kept awake by nice-19 spinners (--awake)' if a.awake else ''}.", f"uptime before: `{result['uptime_before']}`; after: `{result['uptime_after']}`.", ""]
    if lw:
        md += ["| scan mode, db 0 (1,000,000 keys, 5,000 erased) | median (min-max) |", "|---|---|",
               f"| lethe erase, whole process ({lw['n']} ok), default verify = \"scan\" | {mm(lw)} |",
               f"| lethe erase, whole process ({lfw['n']} ok), verify = \"frozen\" | {mm(lfw)} |" if lfw else "",
               f"| lethe peak RSS | {mm(lr, 'MiB', 1)} |",
               f"| runbook step 6, in-process | {mm(s6)} |",
               f"| runbook step 6 + its step-8 SCAN count | {mm(s6c)} |",
               f"| runbook step 6 script, whole process (Python imports included) | {mm(s6w)} |",
               f"| floor: redis-cli --scan \\| xargs redis-cli unlink | {mm(fw)} |",
               f"| **lethe / floor** | **{result['scan']['ratio_lethe_over_floor']:.2f}x** |" if fw else "",
               f"| **lethe / runbook step 6** | **{result['scan']['ratio_lethe_over_step6']:.2f}x** "
               f"(vs step 6 + count: {result['scan']['ratio_lethe_over_step6_plus_count']:.2f}x) |" if s6 else "",
               f"| **lethe verify = \"frozen\" / floor, / runbook step 6** | **{result['scan']['ratio_lethe_frozen_over_floor']:.2f}x, "
               f"{result['scan']['ratio_lethe_frozen_over_step6']:.2f}x** |" if lfw and fw and s6 else "",
               "", "Lethe's phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in lph.items()),
               "Lethe's phases with verify = \"frozen\" (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in lfph.items()),
               f"Lethe's SCANs as Redis timed them (INFO commandstats): {mm(scan_calls, 'calls', 0)}, {mm(scan_us, 'us each', 0)}.",
               "Redis's own SCAN time per run (INFO commandstats; step 6 without its step-8 count): "
               + ", ".join(f"{w} {mm(v, 'ms', 0)}" for w, v in scan_ms.items() if v) + ".", ""]
    for what, s in lat_sum.items():
        pl = s["pooled"]
        md.append(f"GET with {what}, all rounds pooled: p99 quiet {pl['quiet_p99_ms']:.3f} ms (n={pl['quiet_n']}), during "
                  f"{pl['during_p99_ms']:.3f} ms (n={pl['during_n']}), ratio {pl['p99_ratio']:.2f}x; p50 {pl['quiet_p50_ms']:.3f} -> {pl['during_p50_ms']:.3f} ms")
        md.append(f"  per round: p99 quiet {mm(s['p99_quiet_ms'], 'ms')}, during {mm(s['p99_during_ms'], 'ms')}, "
                  f"ratio {mm(s['p99_ratio'], 'x', 2)}; p50 quiet {s['p50_quiet_ms']['median']:.3f} ms, during {s['p50_during_ms']['median']:.3f} ms; "
                  f"erase window {mm(s['erase_window_s'])}")
    if idx_sum:
        md += ["", f"| index mode ({a.index_journal} journal), keys in db | whole process ms | job ms (log) | erase phase ms (log) | Redis's own time ms | peak RSS MiB |",
               "|---|---|---|---|---|---|"]
        for size, s in idx_sum.items():
            md.append(f"| {size:,} | {mm(s['wall_ms'], '', 1)} | {mm(s['job_ms'], '', 1)} | {mm(s['erase_ms'], '', 1)} | "
                      f"{mm(s['redis_server_ms'], '', 1)} | {mm(s['peak_rss_mib'], '', 1)} |")
    md += ["", "Verdict: " + ", ".join(f"{k} {'NOT MEASURED' if v is None else 'MET' if v else 'MISSED'}"
                                      for k, v in verdict.items()),
           f"Results: {os.path.relpath(path, REPO)}; total {result['total_seconds']} s; failed runs: {len(failed)}."]
    print("\n".join(x for x in md if x is not None))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
