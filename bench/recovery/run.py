#!/usr/bin/env python3
"""Issue 31's recovery benchmark: `lethe recovery` replaying N completed erasures into a Redis
restored from a backup, against the peer runbook's way (it has no recovery: re-run its step 6
for each erased subject), on the same restored store, in the same run.

1. Redis db --db (default 13; flushed at the start and at the end) gets N subjects to erase and
   --others subjects never erased, tenant acme, --keys keys each (acme:<s>:session:<k>, strings
   and hashes, values derived from the key so that a re-seed writes the same bytes) and an
   index set idx:acme:<s> listing them. A digest of the DUMP of every other subject's keys is
   taken.
2. N erasures, one `lethe erase` process each (--parallel at once), SQLite journal, one
   `redis` target in index mode. Timed (jobs a second), and checked COMPLETE. With --workdir
   DIR --keep, a later run with the same N, --others and --keys reuses that journal.
3. The "restore": the erased subjects' keys and index sets are written again, as a restore of
   a backup taken before the erasures would bring them back.
4. lethe: `lethe -v recovery --target session-cache --json`, timed (wall clock and peak RSS);
   its log line "Recovery verified; fences open." gives total_ms, store_ms (inside the
   target's calls) and own_ms (the rest); the times of its log lines give the phases.
   peer: step6_loop.py (the venv's python): runbook.step6_redis for each erased subject.
   Each round restores before each side; the order alternates from round to round.
5. After each side: no key of an erased subject's layout (acme:<s>:*) is left; index sets
   left are counted apart (the runbook knows nothing of them); every other subject's keys are
   all there and their DUMP digest is unchanged. Lethe's report must list N scopes.

Writes bench/out/recovery-<UTC time>.json and prints a Markdown table.

Usage: run.py --lethe BIN --peer DIR [--n 3000] [--others 3000] [--keys 3] [--db 13]
              [--rounds 1] [--parallel 2] [--skip peer] [--workdir DIR --keep]
              [--lethe-commit REV]
Standard-library Python; the peer's side runs with --peer-python (the venv's python).
"""
from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "bench", "out")
TENANT = "acme"
TARGET = "session-cache"
TIME = "/usr/bin/time"

CONFIG = """# Written by bench/recovery/run.py
[control]
journal = "sqlite:journal.db"
key_file = "lethe.key"
policy_version = "bench-recovery-1"
certificates = "certificates"

[[target]]
name = "{target}"
kind = "redis"
class = "cache"
url = "redis://127.0.0.1:6379/{db}"
pattern = "{{tenant}}:{{subject}}:*"
mode = "index"
index = "idx:{{tenant}}:{{subject}}"
"""


def log(*a):
    print(*a, file=sys.stderr, flush=True)


class Redis:
    """A minimal RESP2 client: pipelined commands, replies parsed in order."""

    def __init__(self, db: int, host="127.0.0.1", port=6379):
        self.s = socket.create_connection((host, port))
        self.f = self.s.makefile("rb")
        assert self.call("SELECT", db) == "OK"

    @staticmethod
    def _enc(args) -> bytes:
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(out)

    def _read(self):
        line = self.f.readline()
        t, rest = line[:1], line[1:-2]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            raise RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self.f.read(n + 2)
            return data[:-2]
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [self._read() for _ in range(n)]
        raise RuntimeError(f"bad reply {line!r}")

    def pipeline(self, cmds, chunk=2000) -> list:
        out = []
        for i in range(0, len(cmds), chunk):
            part = cmds[i:i + chunk]
            self.s.sendall(b"".join(self._enc(c) for c in part))
            out.extend(self._read() for _ in part)
        return out

    def call(self, *args):
        return self.pipeline([args])[0]

    def keys(self) -> list[bytes]:
        cursor, keys = b"0", []
        while True:
            cursor, page = self.call("SCAN", cursor, "COUNT", 1000)
            keys.extend(page)
            if cursor == b"0":
                return keys


def subject_name(i: int) -> str:
    return f"u{i:05d}"


def seed_cmds(subjects: list[str], keys: int) -> list[tuple]:
    """Each subject's keys and index set; the values depend only on the key, so writing them
    again restores the same bytes."""
    cmds = []
    for s in subjects:
        names = []
        for k in range(keys):
            key = f"{TENANT}:{s}:session:{k}"
            names.append(key)
            h = hashlib.sha256(key.encode()).hexdigest()
            cmds.append(("DEL", key))
            if k % 2 == 0:
                cmds.append(("SET", key, f"{s} turn {k}: {h} {h[:40]}"))
            else:
                cmds.append(("HSET", key, "user", s, "tenant", TENANT, "summary", h, "turn", k))
        cmds.append(("DEL", f"idx:{TENANT}:{s}"))
        cmds.append(("SADD", f"idx:{TENANT}:{s}", *names))
    return cmds


KEY_RE = re.compile(rb"^(?:idx:)?acme:(u\d{5})(:|$)")


def snapshot(r: Redis, erased: set[str]) -> dict:
    """Independent of Lethe and the peer: every key of the db, classified by the subject its
    name carries; the other subjects' keys are DUMPed and digested in key order."""
    data_left = idx_left = unknown = 0
    others = []
    for key in r.keys():
        m = KEY_RE.match(key)
        if not m:
            unknown += 1
            continue
        if m.group(1).decode() in erased:
            if key.startswith(b"idx:"):
                idx_left += 1
            else:
                data_left += 1
        else:
            others.append(key)
    others.sort()
    h = hashlib.sha256()
    for key, dump in zip(others, r.pipeline([("DUMP", k) for k in others])):
        h.update(len(key).to_bytes(4, "big") + key + len(dump).to_bytes(4, "big") + dump)
    return {"erased_data_left": data_left, "erased_idx_left": idx_left, "unknown": unknown,
            "other_keys": len(others), "other_digest": h.hexdigest()}


def check(snap: dict, ref: dict, side: str) -> list[str]:
    bad = []
    if snap["erased_data_left"]:
        bad.append(f"{side}: {snap['erased_data_left']} keys of erased subjects left")
    if snap["unknown"]:
        bad.append(f"{side}: {snap['unknown']} keys of no subject")
    if (snap["other_keys"], snap["other_digest"]) != (ref["other_keys"], ref["other_digest"]):
        bad.append(f"{side}: other subjects' keys changed ({snap['other_keys']} keys, "
                   f"digest {snap['other_digest'][:12]} vs {ref['other_keys']}, {ref['other_digest'][:12]})")
    return bad


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def sh(cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-800:]}")
    return p.stdout


def erase_all(a, work: str, subjects: list[str]) -> float:
    """One `lethe erase` process a subject, --parallel at once; each must say COMPLETE."""
    base = [a.lethe, "--config", "lethe.toml", "erase", "--tenant", TENANT, "--basis",
            "gdpr-art17", "--drain-timeout", "0", "--json"]
    running: list[tuple[str, subprocess.Popen]] = []
    failed = []

    def reap(block: bool):
        for item in list(running):
            s, p = item
            if block or p.poll() is not None:
                out, err = p.communicate()
                running.remove(item)
                if p.returncode != 0 or '"COMPLETE"' not in out:
                    failed.append(f"{s}: exit {p.returncode}: {err.strip()[-300:]}")
                if block:
                    return

    t0 = time.perf_counter()
    for n, s in enumerate(subjects):
        while len(running) >= a.parallel:
            reap(False)
            if len(running) >= a.parallel:
                time.sleep(0.002)
        running.append((s, subprocess.Popen(base + ["--subject", s, "--ticket", f"BENCH-REC-{n}"],
                                            cwd=work, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)))
        if failed:
            break
        if (n + 1) % 500 == 0:
            log(f"  {n + 1}/{len(subjects)} erased, {(n + 1) / (time.perf_counter() - t0):.1f} jobs/s")
    while running:
        reap(True)
    if failed:
        raise SystemExit("erase failed: " + "; ".join(failed[:3]))
    return time.perf_counter() - t0


LOG_RE = re.compile(r"^(\S+?)Z?\s+INFO\s+(.*)$")


def parse_log(stderr: str) -> tuple[dict, list[tuple[float, str]]]:
    """The fields of "Recovery verified; fences open." and each INFO line's (time, message)."""
    fields, lines = {}, []
    for raw in stderr.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", raw)
        m = LOG_RE.match(line)
        if not m:
            continue
        t = dt.datetime.fromisoformat(m.group(1).rstrip("Z")).replace(
            tzinfo=dt.timezone.utc).timestamp()
        msg = m.group(2)
        lines.append((t, msg.split(".")[0]))
        if msg.startswith("Recovery verified; fences open."):
            fields = dict(re.findall(r"(\w+)=(\S+)", msg))
    return fields, lines


def run_lethe(a, work: str, n: int, keys: int) -> dict:
    fd, tf = tempfile.mkstemp(prefix="time-")
    os.close(fd)
    start = time.time()
    t0 = time.perf_counter()
    p = subprocess.run([TIME, "-o", tf, "-f", "%M", a.lethe, "--config", "lethe.toml", "-v",
                        "recovery", "--target", TARGET, "--json"],
                       cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    with open(tf) as f:
        rss = int(f.read().strip().splitlines()[-1])
    os.unlink(tf)
    if p.returncode != 0:
        raise SystemExit(f"lethe recovery failed ({p.returncode}): {p.stderr[-800:]}")
    report = json.loads(p.stdout)
    fields, lines = parse_log(p.stderr)
    if not fields:
        raise SystemExit(f"no 'Recovery verified' line in lethe's log: {p.stderr[-800:]}")
    bad = []
    if len(report["scopes"]) != n or int(fields["scopes"]) != n:
        bad.append(f"lethe: report lists {len(report['scopes'])} scopes, log {fields['scopes']}, expected {n}")
    if report["erased"] != n * (keys + 1):
        bad.append(f"lethe: report erased {report['erased']}, expected {n * (keys + 1)} (keys and index sets)")
    # Phases from the log lines' times: start to fenced, fenced to verified, verified to exit.
    marks = {msg: t for t, msg in lines}
    fenced, verified = marks.get("Recovery fenced its scopes"), marks.get("Recovery verified; fences open")
    phases = None
    if fenced and verified:
        phases = {"start_to_fenced_ms": round((fenced - start) * 1000, 1),
                  "replays_to_verified_ms": round((verified - fenced) * 1000, 1),
                  "verified_to_exit_ms": round((start + wall - verified) * 1000, 1)}
    total, store, own = (int(fields[k]) for k in ("total_ms", "store_ms", "own_ms"))
    return {"wall_s": round(wall, 3), "peak_rss_kib": rss, "total_ms": total, "store_ms": store,
            "own_ms": own, "scopes": n, "erased": report["erased"],
            "own_scopes_per_s": round(n / (own / 1000), 1) if own else None,
            "total_scopes_per_s": round(n / (total / 1000), 1),
            "wall_scopes_per_s": round(n / wall, 1),
            # Lethe's own work counted from the process's start: the wall clock less the store.
            "wall_own_scopes_per_s": round(n / (wall - store / 1000), 1),
            "phases": phases, "bad": bad}


def run_peer(a, subjects_file: str, n: int) -> dict:
    out = sh([a.peer_python, os.path.join(HERE, "step6_loop.py"), a.peer, "--db", str(a.db),
              "--tenant", TENANT, "--subjects", subjects_file],
             env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    res = json.loads(out.strip().splitlines()[-1])
    res["scopes_per_s"] = round(n / res["seconds"], 1)
    res["bad"] = [] if res["subjects"] == n else [f"peer: looped {res['subjects']} subjects"]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lethe", required=True)
    ap.add_argument("--peer", required=True)
    ap.add_argument("--peer-python", default=sys.executable)
    ap.add_argument("--n", type=int, default=3000, help="subjects erased, then replayed")
    ap.add_argument("--others", type=int, default=3000, help="subjects never erased")
    ap.add_argument("--keys", type=int, default=3, help="keys per subject, besides its index set")
    ap.add_argument("--db", type=int, default=13)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=2, help="lethe erase processes at once")
    ap.add_argument("--skip", default="", help="peer")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--lethe-commit")
    a = ap.parse_args()
    if a.db in (0, 1, 9):
        raise SystemExit(f"db {a.db} is refused: the peer's scenarios and the tests use it")
    if a.n < 1 or a.others < 1 or a.keys < 1:
        raise SystemExit("--n, --others and --keys must be at least 1")
    a.lethe = os.path.abspath(a.lethe)
    skip = set(filter(None, a.skip.split(",")))

    work = os.path.abspath(a.workdir) if a.workdir else tempfile.mkdtemp(prefix="lethe-recovery-")
    os.makedirs(work, exist_ok=True)
    erased = [subject_name(i) for i in range(a.n)]
    others = [subject_name(a.n + i) for i in range(a.others)]
    erased_set = set(erased)
    subjects_file = os.path.join(work, "erased.txt")
    with open(subjects_file, "w") as f:
        f.write("\n".join(erased) + "\n")
    shape = {"n": a.n, "others": a.others, "keys": a.keys, "db": a.db}
    marker = os.path.join(work, "seeded.json")

    uptime_before = sh(["uptime"]).strip()
    r = Redis(a.db)
    r.call("FLUSHDB")
    t0 = time.perf_counter()
    r.pipeline(seed_cmds(others + erased, a.keys))
    log(f"seeded {len(others) + len(erased)} subjects in db {a.db} in {time.perf_counter() - t0:.1f} s")
    ref = snapshot(r, erased_set)
    result = {"shape": shape, "workdir": work, "uptime_before": uptime_before, "rounds": []}

    reused = False
    if os.path.exists(marker):
        with open(marker) as f:
            reused = json.load(f) == shape
    if not reused:
        for name in ("journal.db", "journal.db-wal", "journal.db-shm", "lethe.key"):
            if os.path.exists(os.path.join(work, name)):
                os.unlink(os.path.join(work, name))
        shutil.rmtree(os.path.join(work, "certificates"), ignore_errors=True)
        with open(os.path.join(work, "lethe.toml"), "w") as f:
            f.write(CONFIG.format(target=TARGET, db=a.db))
        sh([a.lethe, "--config", "lethe.toml", "journal", "verify"], cwd=work)
        log(f"erasing {a.n} subjects, one lethe erase each, {a.parallel} at once ...")
        secs = erase_all(a, work, erased)
        result["erase_jobs"] = {"seconds": round(secs, 1), "jobs_per_s": round(a.n / secs, 1),
                                "parallel": a.parallel, "load_after": loadavg()}
        log(f"  {a.n} jobs in {secs:.1f} s ({a.n / secs:.1f} jobs/s)")
        bad = check(snapshot(r, erased_set), ref, "erase")
        if bad:
            raise SystemExit("; ".join(bad))
        with open(marker, "w") as f:
            json.dump(shape, f)
    else:
        log(f"reusing the journal of {a.n} completed erasures in {work}")
    result["journal_reused"] = reused

    failures = []
    sides = ["lethe"] + ([] if "peer" in skip else ["peer"])
    for rnd in range(a.rounds):
        order = sides if rnd % 2 == 0 else sides[::-1]
        rec = {"round": rnd + 1}
        for side in order:
            r.pipeline(seed_cmds(erased, a.keys))  # the restore
            restored = snapshot(r, erased_set)
            assert restored["erased_data_left"] == a.n * a.keys, restored
            load = loadavg()
            res = run_lethe(a, work, a.n, a.keys) if side == "lethe" else run_peer(a, subjects_file, a.n)
            res["load_before"], res["load_after"] = load, loadavg()
            snap = snapshot(r, erased_set)
            res["check"] = snap
            res["bad"] += check(snap, ref, side)
            if side == "lethe" and snap["erased_idx_left"]:
                res["bad"].append(f"lethe: {snap['erased_idx_left']} index sets left")
            failures += res["bad"]
            rec[side] = res
            log(f"round {rnd + 1} {side}: {json.dumps({k: v for k, v in res.items() if k != 'check'})}")
        result["rounds"].append(rec)

    r.call("FLUSHDB")
    result["uptime_after"] = sh(["uptime"]).strip()
    result["date_utc"] = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    result["git"] = a.lethe_commit or (
        sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).strip()
        + ("-dirty" if sh(["git", "-C", REPO, "status", "--porcelain", "--", "crates"]).strip() else ""))
    cpu = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    result["machine"] = {"nproc": os.cpu_count(), "cpu": cpu}
    result["failures"] = failures
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, "recovery-" + dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H%M%SZ") + ".json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if not a.keep and not a.workdir:
        shutil.rmtree(work, ignore_errors=True)

    def med(side, key):
        vals = [rd[side][key] for rd in result["rounds"] if side in rd and rd[side][key] is not None]
        return statistics.median(vals) if vals else None

    print(f"Run {result['date_utc']} (commit {result['git']}); {os.cpu_count()} CPUs ({cpu}); "
          f"N = {a.n} erased, {a.others} others, {a.keys} keys + an index set each; "
          f"uptime before: `{uptime_before}`; after: `{result['uptime_after']}`.")
    if "erase_jobs" in result:
        e = result["erase_jobs"]
        print(f"Journal seeded with {a.n} `lethe erase` jobs in {e['seconds']} s ({e['jobs_per_s']} jobs/s, {e['parallel']} at once).")
    print()
    print("| medians over rounds | lethe recovery | peer: step 6 per subject |")
    print("|---|---|---|")
    lw, pw = med("lethe", "wall_s"), med("peer", "seconds")
    print(f"| whole (process wall / in-process loop) | {lw:.3f} s ({a.n / lw:,.0f} scopes/s) | "
          + (f"{pw:.3f} s ({a.n / pw:,.0f} subjects/s) |" if pw else "skipped |"))
    print(f"| lethe total_ms / store_ms / own_ms | {med('lethe', 'total_ms')} / {med('lethe', 'store_ms')} / {med('lethe', 'own_ms')} | |")
    print(f"| lethe scopes/s: own work (own_ms) / own work from the process's start (wall - store_ms) / overall (total_ms) "
          f"| {med('lethe', 'own_scopes_per_s'):,.0f} / {med('lethe', 'wall_own_scopes_per_s'):,.0f} / {med('lethe', 'total_scopes_per_s'):,.0f} | |")
    print(f"| lethe peak RSS | {med('lethe', 'peak_rss_kib') / 1024:.1f} MiB | |")
    if pw:
        print(f"| peer / lethe (whole) | {pw / lw:.1f}x | |")
    print(f"\nJSON: {path}")
    if failures:
        print("FAILED checks: " + "; ".join(failures))
        return 1
    print("All checks ok.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
