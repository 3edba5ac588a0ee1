#!/usr/bin/env python3
"""Issue 2's benchmark on SQLite: Lethe's whole job against a hand-written SQL floor.

Seeds one deployment (seed.py) into a work folder and keeps it pristine; then N times, on a
fresh copy each (rotating which goes first):
  lethe  `lethe --config X -v erase --tenant t03 --subject u0342 --basis gdpr-art17
          --ticket BENCH-1 --drain-timeout 0 --json` (inventory, freeze, erase, verify,
          certificate; journal, key and certificate in the run folder)
  floor  floor.py: the same rows deleted by set-based SQL, one transaction per file
  floor_sd  the same with PRAGMA secure_delete=ON, as Lethe sets on its target connections
All are timed as a process (wall clock, under /usr/bin/time for peak RSS). Every run is
checked: the target has 0 rows left and every other subject's rows are byte-identical to the
pristine copy (SHA3 digest of all remaining rows == digest of the pristine non-target rows).
Writes bench/out/sqlite-<UTC time>.json and prints a Markdown table.

Usage: run.py [--runs 7] [--layout interleaved|grouped] [--workdir DIR] [--lethe PATH] [--keep]
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
from pathlib import Path
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "bench", "out")
TENANT, SUBJECT = "t03", "u0342"
DBS = ("checkpoints.db", "store.db", "app.db")
TIME = "/usr/bin/time"

CONFIG = """# Written by bench/sqlite/run.py
[control]
journal = "sqlite:lethe-journal.db"
key_file = "lethe.key"
policy_version = "bench-1"
certificates = "certificates"

""" + (Path(__file__).resolve().parents[2] / "tests/fixtures/langgraph-sqlite/targets.toml").read_text()

# The target's rows, defined independently of Lethe and of the floor (full JSON parse of every
# checkpoint's metadata, no byte pre-filter; a substr test on the store prefix).
TARGET_THREADS = f"""
CREATE TEMP TABLE tt AS
  SELECT thread_id FROM app.thread_registry WHERE tenant_id = '{TENANT}' AND user_id = '{SUBJECT}'
  UNION
  SELECT thread_id FROM main.checkpoints
   WHERE json_extract(CAST(metadata AS TEXT), '$.tenant_id') = '{TENANT}'
     AND json_extract(CAST(metadata AS TEXT), '$.user_id') = '{SUBJECT}';
"""
NS = f"{TENANT}.{SUBJECT}"
IN_NS = f"(prefix = '{NS}' OR substr(prefix, 1, {len(NS) + 1}) = '{NS}.')"
ORDER = {
    "checkpoints": "thread_id, checkpoint_ns, checkpoint_id",
    "writes": "thread_id, checkpoint_ns, checkpoint_id, task_id, idx",
    "thread_registry": "thread_id",
    "store": "prefix, key",
    "store_vectors": "prefix, key, field_name",
}
NOT_TARGET = {
    "checkpoints": "thread_id NOT IN (SELECT thread_id FROM temp.tt)",
    "writes": "thread_id NOT IN (SELECT thread_id FROM temp.tt)",
    "thread_registry": f"NOT (tenant_id = '{TENANT}' AND user_id = '{SUBJECT}')",
    "store": f"NOT {IN_NS}",
    "store_vectors": f"NOT {IN_NS}",
}


def sh(cmd: list[str], **kw) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
    return p.stdout


def sql(db: str, script: str) -> list[str]:
    """Runs SQL with the sqlite3 CLI (it has sha3_query); returns output lines."""
    return sh(["sqlite3", "-batch", "-noheader", db], input=script).split()


def digests(d: str) -> dict:
    """(rows, SHA3-256) per table of the rows not the target's. The same SQL text runs on the
    pristine copy and after a run (sha3_query hashes the SQL text too); after a run the target's
    rows are also counted to be 0 (target_left), so the digests cover every row left."""
    out = {}
    cp = os.path.join(d, "checkpoints.db")
    app = os.path.join(d, "app.db")
    pre = f"ATTACH DATABASE '{app}' AS app;\n" + TARGET_THREADS
    for db, tables in ((cp, ("checkpoints", "writes")), (app, ("thread_registry",)),
                       (os.path.join(d, "store.db"), ("store", "store_vectors"))):
        script = pre if db == cp else ""
        for t in tables:
            where = f" WHERE {NOT_TARGET[t]}"
            q = f"SELECT * FROM {t}{where} ORDER BY {ORDER[t]}"
            qq = q.replace("'", "''")
            script += f"SELECT count(*) FROM {t}{where}; SELECT hex(sha3_query('{qq}'));\n"
        lines = sql(db, script)
        for i, t in enumerate(tables):
            out[t] = {"rows": int(lines[2 * i]), "sha3": lines[2 * i + 1]}
    return out


def target_left(d: str) -> dict:
    """Rows of the target still present, by the independent definition above."""
    cp = os.path.join(d, "checkpoints.db")
    app = os.path.join(d, "app.db")
    lines = sql(cp, f"ATTACH DATABASE '{app}' AS app;\n" + TARGET_THREADS + f"""
SELECT count(*) FROM temp.tt;
SELECT count(*) FROM checkpoints WHERE thread_id IN (SELECT thread_id FROM temp.tt);
SELECT count(*) FROM writes WHERE thread_id IN (SELECT thread_id FROM temp.tt);
SELECT count(*) FROM app.thread_registry WHERE tenant_id = '{TENANT}' AND user_id = '{SUBJECT}';
""")
    s = sql(os.path.join(d, "store.db"),
            f"SELECT count(*) FROM store WHERE {IN_NS}; SELECT count(*) FROM store_vectors WHERE {IN_NS};")
    return dict(zip(["threads", "checkpoints", "writes", "thread_registry", "store", "store_vectors"],
                    map(int, lines + s)))


def fresh_copy(pristine: str, run_dir: str) -> str:
    mem = os.path.join(run_dir, "memory")
    os.makedirs(mem)
    for f in DBS:
        shutil.copyfile(os.path.join(pristine, f), os.path.join(mem, f))
    os.sync()  # no dirty pages of the copy left for the timed run's fsyncs to flush
    return mem


def timed(cmd: list[str], cwd: str) -> tuple[float, int, str, str, int]:
    """Wall seconds, peak RSS KiB, stdout, stderr, exit code of a process."""
    fd, tf = tempfile.mkstemp(prefix="time-")
    os.close(fd)
    t0 = time.perf_counter()
    p = subprocess.run([TIME, "-o", tf, "-f", "%M"] + cmd, cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    with open(tf) as f:
        rss = int(f.read().split()[-1])
    os.remove(tf)
    return wall, rss, p.stdout, p.stderr, p.returncode


def phases(stderr: str, started: float) -> dict:
    """Seconds per phase, from `lethe -v` log timestamps (UTC) and the spawn time."""
    marks = []
    for line in stderr.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        m = re.match(r"^(\S+)Z\s+INFO\s+(.*?)\s+job=", line)
        if not m:
            continue
        ts = dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.timezone.utc).timestamp()
        tgt = re.search(r"target=(\S+)", line)
        marks.append((m.group(2), tgt.group(1) if tgt else None, ts))
    if not marks:
        return {}

    def at(msg, tgt=None, last=False):
        hits = [ts for mm, tt, ts in marks if mm.startswith(msg) and (tgt is None or tt == tgt)]
        return (hits[-1] if last else hits[0]) if hits else None

    # Targets run at once: a phase ends with the last target's line, and each target's own
    # time is from the phase's start to its line (they overlap).
    req, fence = at("Job requested"), at("Fence closed")
    inv_c, inv_s = at("Inventory taken", "checkpoints"), at("Inventory taken", "memories")
    inv = max(inv_c, inv_s)
    er_c, er_s = at("Target erased", "checkpoints"), at("Target erased", "memories")
    er = max(er_c, er_s)
    done = at("Job complete")
    p = {
        "start_to_request": req - started,
        "freeze": fence - req,
        "inventory": inv - fence,
        "inventory_checkpoints": inv_c - fence,
        "inventory_store": inv_s - fence,
        "erase": er - inv,
        "erase_checkpoints": er_c - inv,
        "erase_store": er_s - inv,
        "verify_and_certificate": done - er,
    }
    return {k: round(v, 4) for k, v in p.items()}


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def machine() -> dict:
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
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "mem_mib": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite_cli": sh(["sqlite3", "--version"]).split()[0],
    }


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)} if xs else {}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--layout", choices=("interleaved", "grouped"), default="interleaved",
                    help="seed.py's row order on disk (default: interleaved, as a live deployment)")
    ap.add_argument("--workdir", help="default: a new temporary folder, removed at the end")
    ap.add_argument("--lethe", default=os.path.join(REPO, "target", "release", "lethe"))
    ap.add_argument("--keep", action="store_true", help="keep the work folder")
    ap.add_argument("--lethe-commit", help="the commit the binary was built from (default: this "
                    "repo's HEAD, marked -dirty if crates/ has uncommitted changes)")
    a = ap.parse_args()

    if not os.path.exists(TIME):
        sys.exit(f"{TIME} is missing: apt-get install -y time")
    if not shutil.which("sqlite3"):
        sys.exit("the sqlite3 CLI is missing: apt-get install -y sqlite3")
    lethe = os.path.abspath(a.lethe)
    if not os.access(lethe, os.X_OK):
        sys.exit(f"no lethe binary at {lethe}: cargo build --release")
    py = sys.executable
    work = a.workdir or tempfile.mkdtemp(prefix="lethe-bench-")
    os.makedirs(work, exist_ok=True)
    t_start = time.perf_counter()
    load_before = loadavg()
    print(f"work folder: {work}; load average before: {load_before}", file=sys.stderr)

    pristine = os.path.join(work, "pristine")
    shutil.rmtree(pristine, ignore_errors=True)
    seed = json.loads(sh([py, os.path.join(HERE, "seed.py"), pristine, "--layout", a.layout]))
    tg = seed["target"]
    print(f"seeded in {seed['seconds']} s: {seed['totals']}; target {tg}", file=sys.stderr)
    expect_cert = {"checkpoints": tg["checkpoints"] + tg["writes"] + tg["thread_registry"],
                   "memories": tg["store"] + tg["store_vectors"]}
    base = digests(pristine)
    base_target = target_left(pristine)
    for t, n in [("checkpoints", tg["checkpoints"]), ("writes", tg["writes"]),
                 ("thread_registry", tg["thread_registry"]), ("store", tg["store"]),
                 ("store_vectors", tg["store_vectors"])]:
        assert base_target[t] == n, f"seed: target {t} {base_target[t]} != {n}"
        assert base[t]["rows"] == seed["totals"][t] - n, f"seed: non-target {t}"

    # Warm the binary and the interpreter (not timed).
    subprocess.run([lethe, "--help"], capture_output=True)
    subprocess.run([py, "-S", "-c", "import sqlite3, json"], capture_output=True)

    runs = []
    for i in range(a.runs):
        kinds = ["lethe", "floor", "floor_sd"]
        order = kinds[i % 3:] + kinds[:i % 3]  # rotate who goes first
        for what in order:
            run_dir = os.path.join(work, f"run-{i + 1}-{what}")
            shutil.rmtree(run_dir, ignore_errors=True)
            mem = fresh_copy(pristine, run_dir)
            rec = {"run": i + 1, "what": what, "load_before": loadavg()}
            problems = []
            if what == "lethe":
                cfg = os.path.join(run_dir, "lethe.toml")
                with open(cfg, "w") as f:
                    f.write(CONFIG)
                started = time.time()
                wall, rss, out, err, rc = timed(
                    [lethe, "--config", cfg, "-v", "erase", "--tenant", TENANT, "--subject", SUBJECT,
                     "--basis", "gdpr-art17", "--ticket", "BENCH-1", "--drain-timeout", "0", "--json"],
                    run_dir)
                rec.update(wall_s=wall, peak_rss_kib=rss, exit=rc)
                try:
                    res = json.loads(out)
                    rec["state"] = res.get("state")
                    counts = {k: v["count"] for k, v in (res.get("certificate") or {}).get("targets", {}).items()}
                    rec["certificate_counts"] = counts
                    if res.get("state") != "COMPLETE":
                        problems.append(f"state {res.get('state')} ({res.get('blocked_reason')})")
                    if counts != expect_cert:
                        problems.append(f"certificate counts {counts} != {expect_cert}")
                    if not res.get("certificate", {}).get("signature"):
                        problems.append("certificate unsigned")
                except ValueError:
                    problems.append(f"no JSON (exit {rc}): {err[-500:]}")
                rec["phases_s"] = phases(err, started)
            else:
                flags = ["--secure-delete"] if what == "floor_sd" else []
                wall, rss, out, err, rc = timed([py, "-S", os.path.join(HERE, "floor.py"), mem, TENANT, SUBJECT] + flags, run_dir)
                rec.update(wall_s=wall, peak_rss_kib=rss, exit=rc)
                try:
                    res = json.loads(out)
                    rec["sql_s"] = res.pop("sql_seconds")
                    rec["deleted"] = res
                    for t in ("checkpoints", "writes", "thread_registry", "store", "store_vectors"):
                        if res[t] != tg[t]:
                            problems.append(f"floor deleted {res[t]} {t}, expected {tg[t]}")
                except ValueError:
                    problems.append(f"no JSON (exit {rc}): {err[-500:]}")
            rec["load_after"] = loadavg()
            # The check: nothing of the target left; everyone else's rows byte-identical.
            left = target_left(mem)
            rec["target_left"] = left
            if any(left.values()):
                problems.append(f"target rows left: {left}")
            now = digests(mem)
            for t, b in base.items():
                if now[t] != b:
                    problems.append(f"{t}: non-target rows changed ({now[t]['rows']} rows vs {b['rows']}, digest differs)")
            rec["ok"] = not problems
            rec["problems"] = problems
            runs.append(rec)
            flag = "ok" if rec["ok"] else "FAILED: " + "; ".join(problems)
            print(f"run {i + 1} {what:8s} {wall:7.3f} s  rss {rss / 1024:5.1f} MiB  {flag}", file=sys.stderr)
            if not a.keep:
                shutil.rmtree(run_dir, ignore_errors=True)

    load_after = loadavg()
    ok_l = [r for r in runs if r["what"] == "lethe" and r["ok"]]
    ok_f = [r for r in runs if r["what"] == "floor" and r["ok"]]
    ok_d = [r for r in runs if r["what"] == "floor_sd" and r["ok"]]
    lw, fw = stats([r["wall_s"] for r in ok_l]), stats([r["wall_s"] for r in ok_f])
    fs = stats([r["sql_s"] for r in ok_f])
    dw, ds = stats([r["wall_s"] for r in ok_d]), stats([r["sql_s"] for r in ok_d])
    lr, fr = stats([r["peak_rss_kib"] / 1024 for r in ok_l]), stats([r["peak_rss_kib"] / 1024 for r in ok_f])
    ratio = lw["median"] / fw["median"] if lw and fw else None
    ratio_sql = lw["median"] / fs["median"] if lw and fs else None
    ratio_sd = lw["median"] / dw["median"] if lw and dw else None
    phase_keys = list(ok_l[0]["phases_s"]) if ok_l and ok_l[0]["phases_s"] else []
    ph = {k: statistics.median(r["phases_s"][k] for r in ok_l) for k in phase_keys}
    failed = [r for r in runs if not r["ok"]]
    verdict = {
        "time_within_3x_floor": ratio is not None and ratio <= 3.0,
        "peak_rss_under_64_mib": bool(lr) and lr["max"] < 64.0,
        "all_runs_checked_ok": not failed,
    }
    result = {
        "benchmark": "sqlite",
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": a.lethe_commit or (
            sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).strip()
            + ("-dirty" if sh(["git", "-C", REPO, "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"]).strip() else "")),
        "lethe_binary": {"path": lethe, "version": sh([lethe, "--version"]).strip(),
                         "mtime_utc": dt.datetime.fromtimestamp(os.path.getmtime(lethe), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "machine": machine(),
        "load_before": load_before,
        "load_after": load_after,
        "seed": seed,
        "runs_requested": a.runs,
        "lethe_wall_s": lw, "floor_wall_s": fw, "floor_sql_s": fs,
        "floor_secure_delete_wall_s": dw, "floor_secure_delete_sql_s": ds,
        "lethe_peak_rss_mib": lr, "floor_peak_rss_mib": fr,
        "ratio_lethe_over_floor": ratio, "ratio_lethe_over_floor_sql": ratio_sql,
        "ratio_lethe_over_floor_secure_delete": ratio_sd,
        "lethe_phases_median_s": ph,
        "verdict": verdict,
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "runs": runs,
    }
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"sqlite-{result['date_utc'].replace(':', '')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if not a.keep and not a.workdir:
        shutil.rmtree(work, ignore_errors=True)

    def mm(s, unit="s", k=3):
        return f"{s['median']:.{k}f} {unit} ({s['min']:.{k}f}-{s['max']:.{k}f})" if s else "n/a"

    m = result["machine"]
    md = [
        f"Run {result['date_utc']} (commit {result['git']}, layout {a.layout}), {len(ok_l)}/{len(ok_f)}/{len(ok_d)} of {a.runs} runs each checked ok; "
        f"{m['nproc']} CPUs ({m['cpu']}), {m['mem_mib']} MiB RAM; load average {load_before} before, {load_after} after.",
        "",
        "| | median (min-max) | peak RSS, median (min-max) |",
        "|---|---|---|",
        f"| lethe erase (whole job, process wall clock) | {mm(lw)} | {mm(lr, 'MiB', 1)} |",
        f"| floor (set-based SQL, process wall clock) | {mm(fw)} | {mm(fr, 'MiB', 1)} |",
        f"| floor, SQL alone (in-process) | {mm(fs)} | |",
        f"| floor with secure_delete=ON (as Lethe), process wall clock | {mm(dw)} | |",
        f"| floor with secure_delete=ON, SQL alone | {mm(ds)} | |",
        f"| **ratio lethe / floor** | **{ratio:.2f}x** (vs SQL alone: {ratio_sql:.2f}x) | |" if ratio else "| ratio | n/a | |",
        f"| ratio lethe / floor with secure_delete | {ratio_sd:.2f}x | |" if ratio_sd else "| ratio (secure_delete) | n/a | |",
        "",
        "Lethe's phases (median s, from `-v` log timestamps): " + ", ".join(f"{k} {v:.3f}" for k, v in ph.items()),
        "",
        f"Targets: within 3x of the floor: {'MET' if verdict['time_within_3x_floor'] else 'MISSED'}; "
        f"peak memory under 64 MiB: {'MET' if verdict['peak_rss_under_64_mib'] else 'MISSED'}; "
        f"failed runs: {len(failed)}.",
        f"Results: {os.path.relpath(path, REPO)}; total {result['total_seconds']} s.",
    ]
    print("\n".join(md))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
