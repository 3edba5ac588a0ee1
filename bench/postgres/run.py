#!/usr/bin/env python3
"""Issue 3's benchmark on PostgreSQL: Lethe against the runbook as written and LangGraph's own
batch calls, on the peer's scaled scenario (real LangGraph data, PostgreSQL db `lg`, Redis db 0).

Seeds once with the peer's `seed.py --scenario scaled` (1,000 subjects; target t03/u0342: 200
threads, 2,000 checkpoints, 1,500 blobs, 3,000 writes, 200 registry rows, 2,000 store items and
5,000 Redis keys). Then N times, rotating which goes first, each on a freshly re-seeded target
(`seed.py --scenario scaled --target-only`):
  runbook  the peer's runbook.py --scenario scaled: steps 3, 4, 6 (Redis) and 8, per-step seconds
           as it reports them; then step8_pg.py times step 8 again with Redis stubbed out (its
           PostgreSQL part alone)
  bulk     the peer's bulk_reference.py --scenario scaled (prune + one store.batch), the same way
  lethe    `lethe --config X -v erase --tenant t03 --subject u0342 --basis gdpr-art17 --ticket
           BENCH-1 --drain-timeout 0 --json`: targets langgraph-postgres-checkpointer (registry +
           metadata) and langgraph-postgres-store, journal on PostgreSQL (database
           lethe_journal_bench on the same server, recreated and initialised before each run);
           whole process wall clock and peak RSS (/usr/bin/time -f %M)
  serve    the same job asked of a warm `lethe -v serve` (started once with the same targets,
           journal database lethe_journal_bench_serve, warmed by one untimed job on t09/u0999
           before the before-snapshot): from `POST /v1/jobs` to `GET /v1/jobs/ID` answering
           COMPLETE with its certificate, one GET ?wait_ms=30000 on one kept-alive connection (--serve-poll-ms N: a GET every N ms)
Then, for information: lethe once with a third target, `redis` (db 0, scan mode); and the
100,000-row variant: the target grown by grow_target.py (server-side copies of its threads),
erased by lethe with the two PostgreSQL targets.
Every run is checked with the peer's `verify.py snapshot` before and `verify.py compare` after
(target gone, the 999 others untouched), and by this script's own counts of the target's rows.
Lethe's certificate must count exactly the target's rows. Lethe's runs without the redis
target leave the target's 5,000 Redis keys: compare reports them, and the run passes only if
those are compare's only problems.
Writes bench/out/postgres-<UTC time>.json and prints Markdown tables.

Usage: run.py --peer DIR [--runs 5] [--no-seed] [--big-threads 3000] [--big-items 2000]
              [--skip redis,big] [--kinds runbook,bulk,lethe,serve] [--lethe PATH] [--workdir DIR --keep]
Runs with the venv's python (scripts/pg python): psycopg, redis-py.
"""
from __future__ import annotations

import argparse
import atexit
import datetime as dt
import http.client
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "bench", "out")
PG = os.path.join(REPO, "scripts", "pg")
TENANT, SUBJECT = "t03", "u0342"
TARGET = f"{TENANT}/{SUBJECT}"
TIME = "/usr/bin/time"
# The serve kind's untimed first job, on another subject, before the before-snapshot: every
# timed run then compares against a deployment where it is already erased.
WARM_TENANT, WARM_SUBJECT = "t09", "u0999"
SERVE_POLL_S = 0.0  # the default of --serve-poll-ms: 0, one GET that waits (wait_ms)
SERVE = """
[serve]
listen = "127.0.0.1:0"

[[serve.token]]
role = "operator"
token_file = "operator.token"
"""

CONFIG = """# Written by bench/postgres/run.py
[control]
journal = "{journal_url}"
key_file = "lethe.key"
policy_version = "bench-pg-1"
certificates = "certificates"

[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "{db_url}"
registry = {{ table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }}
metadata = {{ tenant = "tenant_id", subject = "user_id" }}

[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "{db_url}"
namespace = ["{{tenant}}", "{{subject}}"]
"""
REDIS_TARGET = """
[[target]]
name = "session-cache"
kind = "redis"
class = "cache"
url = "redis://127.0.0.1:6379/0"
pattern = "{tenant}:{subject}:*"
mode = "scan"
"""

# The target's rows, defined apart from Lethe: registry threads, plus threads whose metadata
# *contains* the owner (jsonb @>, where Lethe uses ->>), their rows in the three tables, the
# registry rows, and store rows whose prefix is t03.u0342 or below it.
TARGET_SQL = """
WITH th AS (
  SELECT thread_id FROM thread_registry WHERE tenant_id = %(t)s AND user_id = %(u)s
  UNION
  SELECT thread_id FROM checkpoints WHERE metadata @> jsonb_build_object('tenant_id', %(t)s::text, 'user_id', %(u)s::text))
SELECT (SELECT coalesce(array_agg(thread_id), '{}') FROM th),
       (SELECT count(*) FROM checkpoints WHERE thread_id IN (SELECT thread_id FROM th)),
       (SELECT count(*) FROM checkpoint_blobs WHERE thread_id IN (SELECT thread_id FROM th)),
       (SELECT count(*) FROM checkpoint_writes WHERE thread_id IN (SELECT thread_id FROM th)),
       (SELECT count(*) FROM thread_registry WHERE tenant_id = %(t)s AND user_id = %(u)s),
       (SELECT count(*) FROM store WHERE prefix = %(p)s OR left(prefix, length(%(p)s) + 1) = %(p)s || '.')
"""
LEFT_SQL = """
SELECT (SELECT count(*) FROM checkpoints WHERE thread_id = ANY(%(th)s)),
       (SELECT count(*) FROM checkpoint_blobs WHERE thread_id = ANY(%(th)s)),
       (SELECT count(*) FROM checkpoint_writes WHERE thread_id = ANY(%(th)s))
"""
TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "thread_registry", "store")


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def sh(cmd: list[str], ok=(0,), **kw) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if p.returncode not in ok:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-1500:]}")
    return p


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
    """Seconds per phase from `lethe -v` log timestamps (UTC): each interval is counted in the
    phase of the log line that ends it. Targets run at once, so a phase is from the previous
    phase's last line to its own last line ("inventory": every target's inventory), not a sum
    of per-target times."""
    names = {"Job requested": "start_to_request", "Fence closed": "freeze", "Inventory taken": "inventory",
             "Target erased": "erase", "Job complete": "verify_and_certificate"}
    out, prev = {}, started
    for line in stderr.splitlines():
        line = re.sub(r"\x1b\[[0-9;]*m", "", line)
        m = re.match(r"^(\S+)Z\s+INFO\s+(.*?)\s+job=", line)
        if not m:
            continue
        name = next((v for k, v in names.items() if m.group(2).startswith(k)), None)
        if name is None:
            continue
        ts = dt.datetime.fromisoformat(m.group(1)).replace(tzinfo=dt.timezone.utc).timestamp()
        out[name] = round(out.get(name, 0.0) + ts - prev, 4)
        prev = ts
    return out


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def stats(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)} if xs else {}


def cert_counts(outcome: dict) -> dict:
    return {k: v["count"] for k, v in (outcome.get("certificate") or {}).get("targets", {}).items()}


def check_outcome(j: dict, before: dict, with_redis: bool, rec: dict, problems: list[str]) -> None:
    """A job's outcome (`erase --json`, or `GET /v1/jobs/ID`): COMPLETE, signed, and counting
    exactly the target's rows as this script counted them before the run."""
    expect = {"checkpoints": before["checkpoints"] + before["checkpoint_blobs"] + before["checkpoint_writes"] + before["thread_registry"],
              "memories": before["store"]}
    if with_redis:
        expect["session-cache"] = before["redis_keys"]
    rec["expected_counts"] = expect
    rec["state"] = j.get("state")
    counts = cert_counts(j)
    rec["certificate_counts"] = counts
    if j.get("state") != "COMPLETE":
        problems.append(f"state {j.get('state')} ({j.get('blocked_reason')})")
    if counts != expect:
        problems.append(f"certificate counts {counts} != {expect}")
    if not (j.get("certificate") or {}).get("signature"):
        problems.append("certificate unsigned")


class Server:
    """A `lethe -v serve` this script started, and a client on one kept-alive connection."""

    def __init__(self, proc: subprocess.Popen, addr: str, token: str, err_path: str, poll_s: float):
        self.proc, self.addr, self.token, self.err_path, self.poll_s = proc, addr, token, err_path, poll_s
        self.conn = None

    def connect(self) -> None:
        """A new connection, used once before the clock: the server closes connections idle for
        60 s, and the other kinds' runs take longer than that."""
        if self.conn:
            self.conn.close()
        host, port = self.addr.rsplit(":", 1)
        self.conn = http.client.HTTPConnection(host, int(port), timeout=60)
        self.conn.request("GET", "/healthz")
        self.conn.getresponse().read()

    def call(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        headers = {"Authorization": f"Bearer {self.token}"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")

    def job(self, tenant: str, subject: str, ticket: str) -> dict:
        """Times one job from its POST to the GET that answers COMPLETE (or BLOCKED) with its
        certificate: one `GET /v1/jobs/ID?wait_ms=30000`, which answers when the job has ended,
        or (poll_s > 0, for a binary without it) a GET every poll_s."""
        with open(self.err_path, "rb") as f:
            log_from = f.seek(0, 2)
        self.connect()
        started = time.time()
        t0 = time.perf_counter()
        status, acc = self.call("POST", "/v1/jobs", {"tenant": tenant, "subject": subject, "basis": "gdpr-art17",
                                                     "ticket": ticket, "drain_timeout_s": 0})
        if status != 202:
            raise RuntimeError(f"POST /v1/jobs answered {status}: {acc}")
        polls = 0
        wait = "" if self.poll_s > 0 else "?wait_ms=30000"
        while True:
            status, out = self.call("GET", f"/v1/jobs/{acc['job_id']}{wait}")
            polls += 1
            if status != 200:
                raise RuntimeError(f"GET /v1/jobs/{acc['job_id']} answered {status}: {out}")
            if out.get("state") in ("COMPLETE", "BLOCKED") and (out.get("certificate") or out.get("state") == "BLOCKED"):
                break
            time.sleep(self.poll_s)
        wall = time.perf_counter() - t0
        time.sleep(0.05)  # the log line of the job's end may follow its journal commit
        with open(self.err_path, "rb") as f:
            f.seek(log_from)
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if acc["job_id"] in ln]
        return {"wall_s": wall, "polls": polls, "outcome": out, "phases_s": phases("\n".join(lines), started)}

    def rss_kib(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_server(a, lethe: str, db_url: str, run_dir: str) -> Server:
    """`lethe -v serve` with the PostgreSQL targets, on its own journal database (recreated),
    on a free loopback port, one operator token."""
    import psycopg
    os.makedirs(run_dir, exist_ok=True)
    journal_db = a.journal_db + "_serve"
    with psycopg.connect(a.pg_url, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{journal_db}" WITH (FORCE)')
        c.execute(f'CREATE DATABASE "{journal_db}"')
    cfg = os.path.join(run_dir, "lethe.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(db_url=db_url, journal_url=a.pg_url.rsplit("/", 1)[0] + "/" + journal_db) + SERVE)
    token = os.urandom(32).hex()
    fd = os.open(os.path.join(run_dir, "operator.token"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    out_path, err_path = os.path.join(run_dir, "serve.out"), os.path.join(run_dir, "serve.err")
    proc = subprocess.Popen([lethe, "--config", cfg, "-v", "serve"], cwd=run_dir,
                            stdout=open(out_path, "w"), stderr=open(err_path, "w"))
    atexit.register(lambda: proc.poll() is None and (proc.terminate(), proc.wait()))
    for _ in range(200):
        with open(out_path) as f:
            m = re.search(r"Listening on http://(\S+)", f.read())
        if m:
            return Server(proc, m.group(1), token, err_path, a.serve_poll_ms / 1000)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    with open(err_path) as f:
        sys.exit(f"lethe serve did not start: {f.read()[-1500:]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer", required=True, help="the peer runbook's folder")
    ap.add_argument("--pg-url", default="postgres://postgres@127.0.0.1:5432/postgres",
                    help="the server (the peer's scaled scenario uses its database lg)")
    ap.add_argument("--journal-db", default="lethe_journal_bench",
                    help="Lethe's journal: this PostgreSQL database on the --pg-url server, recreated before each run")
    ap.add_argument("--metadata-index", action="store_true",
                    help="after seeding, add the index the README recommends on checkpoints.metadata's owner keys")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--no-seed", action="store_true", help="skip the full seed (db lg must hold the scaled scenario)")
    ap.add_argument("--big-threads", type=int, default=3000, help="the 100,000-row variant's thread count")
    ap.add_argument("--big-items", type=int, default=2000, help="the 100,000-row variant's store items")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: redis,big")
    ap.add_argument("--kinds", default="runbook,bulk,lethe,serve", help="what the timed rounds run")
    ap.add_argument("--serve-poll-ms", type=float, default=SERVE_POLL_S * 1000,
                    help="serve: poll GET /v1/jobs/ID every N ms instead of one GET ?wait_ms= that "
                         "answers when the job has ended (default 0: wait; a binary without wait_ms needs N > 0)")
    ap.add_argument("--snapshot-each", action="store_true",
                    help="take verify.py's before-snapshot right before every run (about 8 s each) instead "
                         "of once, of the freshly seeded deployment, for all timed runs")
    ap.add_argument("--lethe", default=os.path.join(REPO, "target", "release", "lethe"))
    ap.add_argument("--lethe-commit")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--awake", action="store_true",
                    help="keep every CPU busy with a nice-19 spinner during the whole run (see the README: "
                         "on this VM an idle CPU makes each localhost round trip ~3x slower)")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    if a.awake:
        spinners = [subprocess.Popen(["nice", "-n", "19", sys.executable, "-c", "while True: pass"])
                    for _ in range(os.cpu_count() or 1)]

        def stop_spinners():
            for p in spinners:
                p.kill()
                p.wait()
        atexit.register(stop_spinners)

    import psycopg  # noqa: E402
    import redis  # noqa: E402
    from psycopg.conninfo import conninfo_to_dict, make_conninfo  # noqa: E402

    peer = os.path.abspath(a.peer)
    lethe = os.path.abspath(a.lethe)
    if not os.access(lethe, os.X_OK):
        sys.exit(f"no lethe binary at {lethe}")
    if not os.path.exists(TIME):
        sys.exit(f"{TIME} is missing: apt-get install -y time")
    py = sys.executable
    ci = conninfo_to_dict(a.pg_url)
    db_url = a.pg_url.rsplit("/", 1)[0] + "/lg"
    lg = make_conninfo(a.pg_url, dbname="lg")
    host = str(ci.get("host", "127.0.0.1"))
    # The peer puts LG_PG_HOST into a URI's authority: a Unix socket's folder goes to PGHOST instead.
    socket_env = {"LG_PG_HOST": "", "PGHOST": host} if host.startswith("/") else {"LG_PG_HOST": host}
    helper_env = dict(os.environ, LG_PG_PORT=str(ci.get("port", "5432")),
                      LG_PG_USER=str(ci.get("user", "postgres")), PYTHONDONTWRITEBYTECODE="1", **socket_env)
    r0 = redis.Redis(host="127.0.0.1", port=6379, db=0)  # the peer's scripts hard-code it
    journal_url = a.pg_url.rsplit("/", 1)[0] + "/" + a.journal_db
    work = a.workdir or tempfile.mkdtemp(prefix="lethe-bench-pg-")
    os.makedirs(work, exist_ok=True)
    peer_out = os.path.join(work, "peer-out")
    os.makedirs(peer_out, exist_ok=True)
    t_start = time.perf_counter()
    load_before, uptime_before = loadavg(), sh(["uptime"]).stdout.strip()
    log(f"work folder: {work}; {uptime_before}")

    def peer_run(script: str, *args: str, ok=(0,)) -> subprocess.CompletedProcess:
        return sh([PG, "peer", a.pg_url, script, *args], ok=ok, env=dict(os.environ, PEER_OUT=peer_out))

    def helper(script: str, *args: str) -> dict:
        return json.loads(sh([py, os.path.join(HERE, script), peer, *args], env=helper_env).stdout)

    def target_rows() -> dict:
        with psycopg.connect(lg) as c:
            th, cp, bl, wr, reg, st = c.execute(TARGET_SQL, {"t": TENANT, "u": SUBJECT, "p": f"{TENANT}.{SUBJECT}"}).fetchone()
        redis_keys = sum(1 for _ in r0.scan_iter(match=f"{TENANT}:{SUBJECT}:*", count=10_000))
        return {"threads": list(th), "checkpoints": cp, "checkpoint_blobs": bl, "checkpoint_writes": wr,
                "thread_registry": reg, "store": st, "redis_keys": redis_keys}

    def rows_left(threads: list[str]) -> dict:
        now = target_rows()
        with psycopg.connect(lg) as c:
            cp, bl, wr = c.execute(LEFT_SQL, {"th": threads}).fetchone()
        # Rows of the threads the target had before the run, and of any thread it has now.
        return {"checkpoints": max(cp, now["checkpoints"]), "checkpoint_blobs": max(bl, now["checkpoint_blobs"]),
                "checkpoint_writes": max(wr, now["checkpoint_writes"]), "thread_registry": now["thread_registry"],
                "store": now["store"], "redis_keys": now["redis_keys"]}

    def redis_residue_only(cmp: dict, n_redis: int) -> list[str]:
        """compare's problems other than the target's own Redis keys left in place."""
        bad = []
        for p in cmp.get("problems", []):
            if p == f"target {TARGET} still has {n_redis} redis_keys":
                continue
            m = re.fullmatch(r"redis dbsize (\d+) != expected (\d+)", p)
            if m and int(m.group(1)) - int(m.group(2)) == n_redis:
                continue
            bad.append(p)
        return bad

    # ------------------------------------------------------------------ seed
    seed = None
    if not a.no_seed:
        t = time.perf_counter()
        seed = json.loads(peer_run("seed.py", "--scenario", "scaled").stdout)
        seed["wall_s"] = round(time.perf_counter() - t, 1)
        log(f"seeded in {seed['wall_s']} s: {seed['counts']}")
    index_sql = ("CREATE INDEX IF NOT EXISTS checkpoints_owner_idx "
                 "ON checkpoints ((metadata->>'tenant_id'), (metadata->>'user_id'))")
    with psycopg.connect(lg, autocommit=True) as c:
        if a.metadata_index:
            t = time.perf_counter()
            c.execute(index_sql)
            c.execute("ANALYZE checkpoints")
            log(f"metadata index made in {time.perf_counter() - t:.1f} s")
        else:
            c.execute("DROP INDEX IF EXISTS checkpoints_owner_idx")
    subprocess.run([lethe, "--help"], capture_output=True)  # warm the binary (not timed)

    # ------------------------------------------------------------------ a warm `lethe serve`
    server = None
    if "serve" in a.kinds.split(","):
        server = start_server(a, lethe, db_url, os.path.join(work, "serve"))
        warm = server.job(WARM_TENANT, WARM_SUBJECT, "BENCH-WARM")
        if warm["outcome"].get("state") != "COMPLETE":
            sys.exit(f"the serve warm-up job on {WARM_TENANT}/{WARM_SUBJECT} ended {warm['outcome'].get('state')}")
        log(f"lethe serve on {server.addr}, warmed by one job on {WARM_TENANT}/{WARM_SUBJECT} in {warm['wall_s']:.3f} s "
            f"(certificate {cert_counts(warm['outcome'])})")

    pristine = None
    if not a.snapshot_each:
        # One before-snapshot for every timed run: the deployment as seeded. Each run's
        # after-snapshot is compared with it, so a run passes only if the target is gone and the
        # other 999 subjects are exactly as seeded (a re-seed that touched them would fail too).
        # The target's re-seeded rows are counted before each run by this script (target_rows).
        pristine = os.path.join(work, "pristine-before.json")
        peer_run("verify.py", "snapshot", "--scenario", "scaled", "--out", pristine)

    def one(kind: str, label: str, run_dir: str, with_redis=False, grow: dict | None = None) -> dict:
        os.makedirs(run_dir, exist_ok=True)
        rec = {"label": label, "what": kind}
        t = time.perf_counter()
        rs = json.loads(peer_run("seed.py", "--scenario", "scaled", "--target-only").stdout)
        rec["reseed_s"] = round(time.perf_counter() - t, 1)
        if grow:
            rec["grow"] = helper("grow_target.py", "--threads", str(grow["threads"]), "--items", str(grow["items"]))
        before = target_rows()
        rec["target_before"] = {k: v for k, v in before.items() if k != "threads"}
        rec["target_before"]["threads"] = len(before["threads"])
        b, af = os.path.join(run_dir, "before.json"), os.path.join(run_dir, "after.json")
        if pristine and not grow:
            b = pristine
        else:
            peer_run("verify.py", "snapshot", "--scenario", "scaled", "--out", b)
        rec["before_snapshot"] = "pristine" if b == pristine else "own"
        problems = []
        if rs["counts"]["target_checkpoints"] != 2000:
            problems.append(f"re-seed: target has {rs['counts']['target_checkpoints']} checkpoints")
        want = {"checkpoints": 2000, "checkpoint_blobs": 1500, "checkpoint_writes": 3000, "thread_registry": 200,
                "store": 2000, "redis_keys": 5000, "threads": 200}
        if not grow and rec["target_before"] != want:
            problems.append(f"re-seeded target {rec['target_before']} != {want}")
        rec["load_before"] = loadavg()
        if kind in ("runbook", "bulk"):
            script = "runbook.py" if kind == "runbook" else "bulk_reference.py"
            t = time.perf_counter()
            res = json.loads(peer_run(script, "--scenario", "scaled").stdout)
            rec["subprocess_wall_s"] = time.perf_counter() - t
            rec["steps_s"] = {k.split("_")[0]: v["seconds"] for k, v in res["steps"].items()}
            rec["steps"] = res["steps"]
            rec["process_s"] = res["process_s"]
            rec["load_after"] = loadavg()
            s8 = helper("step8_pg.py")
            rec["step8_pg_s"] = s8["seconds"]
            if not res["steps"]["step8_verify"]["ok"]:
                problems.append(f"its own step 8 says not ok: {res['steps']['step8_verify']}")
        elif kind == "serve":
            job = server.job(TENANT, SUBJECT, "BENCH-1")
            rec.update(wall_s=job["wall_s"], polls=job["polls"], load_after=loadavg(),
                       server_rss_kib=server.rss_kib(), phases_s=job["phases_s"])
            check_outcome(job["outcome"], before, False, rec, problems)
        else:
            cfg = os.path.join(run_dir, "lethe.toml")
            with open(cfg, "w") as f:
                f.write(CONFIG.format(db_url=db_url, journal_url=journal_url)
                        + (REDIS_TARGET if with_redis else ""))
            # A fresh journal database whose tables exist, as a deployed journal's do (untimed).
            with psycopg.connect(a.pg_url, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{a.journal_db}" WITH (FORCE)')
                c.execute(f'CREATE DATABASE "{a.journal_db}"')
            sh([lethe, "--config", cfg, "journal", "verify"], cwd=run_dir)
            started = time.time()
            wall, rss, out, err, rc = timed(
                [lethe, "--config", cfg, "-v", "erase", "--tenant", TENANT, "--subject", SUBJECT,
                 "--basis", "gdpr-art17", "--ticket", "BENCH-1", "--drain-timeout", "0", "--json"], run_dir)
            rec.update(wall_s=wall, peak_rss_kib=rss, exit=rc, load_after=loadavg())
            rec["phases_s"] = phases(err, started)
            try:
                check_outcome(json.loads(out), before, with_redis, rec, problems)
            except ValueError:
                problems.append(f"no JSON (exit {rc}): {err[-800:]}")
        # The checks: the target's rows gone, the others untouched (the peer's compare).
        left = rows_left(before["threads"])
        rec["target_left"] = left
        for k, v in left.items():
            if v == 0:
                continue
            if k == "thread_registry" and kind in ("runbook", "bulk"):
                continue  # the runbook never erases the registry (a trap the peer documents)
            if k == "redis_keys" and kind in ("lethe", "serve") and not with_redis:
                continue  # not a target of this run; compare's problems are checked below
            problems.append(f"target {k} left: {v}")
        peer_run("verify.py", "snapshot", "--scenario", "scaled", "--out", af)
        cmp = json.loads(peer_run("verify.py", "compare", "--scenario", "scaled", b, af, ok=(0, 1)).stdout)
        rec["compare"] = {k: cmp[k] for k in ("ok", "non_target_users_untouched", "non_target_users_changed", "problems")}
        if kind in ("lethe", "serve") and not with_redis:
            bad = redis_residue_only(cmp, before["redis_keys"])
            rec["compare_problems_expected"] = [p for p in cmp["problems"] if p not in bad]
            problems += [f"compare: {p}" for p in bad]
        elif not cmp["ok"]:
            problems += [f"compare: {p}" for p in cmp["problems"]]
        if cmp["non_target_users_untouched"] != 999:
            problems.append(f"compare: {cmp['non_target_users_untouched']} others untouched, not 999")
        rec["ok"], rec["problems"] = not problems, problems
        if kind == "lethe":
            msg = f"{rec['wall_s']:.3f} s  rss {rec['peak_rss_kib'] / 1024:.1f} MiB  " + \
                  " ".join(f"{k}={v:.3f}" for k, v in rec["phases_s"].items())
        elif kind == "serve":
            msg = f"{rec['wall_s']:.3f} s  {rec['polls']} polls  server rss {rec['server_rss_kib'] / 1024:.1f} MiB  " + \
                  " ".join(f"{k}={v:.3f}" for k, v in rec["phases_s"].items())
        else:
            st = rec["steps_s"]
            msg = (f"steps 3 {st['step3']:.3f}  4 {st['step4']:.3f}  8 {st['step8']:.3f} (PG part {rec['step8_pg_s']:.3f})"
                   f"  6 {st['step6']:.3f}  process {rec['process_s']:.3f}")
        log(f"{label:10s} {kind:7s} {msg}  {'ok' if rec['ok'] else 'FAILED: ' + '; '.join(problems)}")
        if not a.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
        return rec

    runs = []
    for i in range(a.runs):
        kinds = a.kinds.split(",")
        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            runs.append(one(kind, f"run {i + 1}", os.path.join(work, f"run-{i + 1}-{kind}")))
    extra = []
    if "redis" not in skip:
        extra.append(one("lethe", "with redis", os.path.join(work, "lethe-redis"), with_redis=True))
    if "big" not in skip:
        extra.append(one("lethe", "100k rows", os.path.join(work, "lethe-big"),
                         grow={"threads": a.big_threads, "items": a.big_items}))
    server_rss_kib = None
    if server:
        server_rss_kib = server.rss_kib()
        server.stop()
    load_after, uptime_after = loadavg(), sh(["uptime"]).stdout.strip()

    # ------------------------------------------------------------------ summary
    def ok(kind):
        return [r for r in runs if r["what"] == kind and r["ok"]]

    def steps(kind):
        rs = ok(kind)
        if not rs:
            return {}
        d = {f"step{n}": stats([r["steps_s"][f"step{n}"] for r in rs]) for n in (3, 4, 6, 8)}
        d["step8_pg"] = stats([r["step8_pg_s"] for r in rs])
        d["sum_348"] = stats([r["steps_s"]["step3"] + r["steps_s"]["step4"] + r["steps_s"]["step8"] for r in rs])
        d["sum_348pg"] = stats([r["steps_s"]["step3"] + r["steps_s"]["step4"] + r["step8_pg_s"] for r in rs])
        d["sum_34"] = stats([r["steps_s"]["step3"] + r["steps_s"]["step4"] for r in rs])
        d["process"] = stats([r["process_s"] for r in rs])
        return d

    rb, bk = steps("runbook"), steps("bulk")
    lw = stats([r["wall_s"] for r in ok("lethe")])
    lr = stats([r["peak_rss_kib"] / 1024 for r in ok("lethe")])
    ph_keys = list(ok("lethe")[0]["phases_s"]) if ok("lethe") else []
    lph = {k: statistics.median(r["phases_s"].get(k, 0) for r in ok("lethe")) for k in ph_keys}

    # The job alone: from its request journaled to its certificate, with the process started and
    # its connections open, as the runbook's clock starts after its imports and connections.
    # Reported beside the whole process; the verdicts use the whole process.
    lj = stats([sum(v for k, v in r["phases_s"].items() if k != "start_to_request") for r in ok("lethe")])
    # The warm server: from POST /v1/jobs to the GET that shows it COMPLETE with its certificate.
    sv = stats([r["wall_s"] for r in ok("serve")])
    sph_keys = list(ok("serve")[0]["phases_s"]) if ok("serve") else []
    sph = {k: statistics.median(r["phases_s"].get(k, 0) for r in ok("serve")) for k in sph_keys}

    def ratio(x, y):
        return x["median"] / y["median"] if x and y else None

    ratios = {
        "lethe_over_runbook_348": ratio(lw, rb.get("sum_348")),
        "lethe_over_runbook_348pg": ratio(lw, rb.get("sum_348pg")),
        "lethe_over_bulk_348": ratio(lw, bk.get("sum_348")),
        "lethe_over_bulk_348pg": ratio(lw, bk.get("sum_348pg")),
        "lethe_over_bulk_34": ratio(lw, bk.get("sum_34")),
        "lethe_job_over_runbook_348": ratio(lj, rb.get("sum_348")),
        "lethe_job_over_runbook_348pg": ratio(lj, rb.get("sum_348pg")),
        "serve_over_runbook_348pg": ratio(sv, rb.get("sum_348pg")),
        "serve_over_runbook_348": ratio(sv, rb.get("sum_348")),
    }
    big = next((r for r in extra if r["label"] == "100k rows"), None)
    failed = [r for r in runs + extra if not r["ok"]]
    def at_most(x, limit):  # None: not measured in this invocation (a part skipped)
        return None if x is None else x <= limit

    verdict = {
        "lethe_20x_faster_than_runbook_348": at_most(ratios["lethe_over_runbook_348"], 1 / 20),
        "lethe_20x_faster_than_runbook_348pg": at_most(ratios["lethe_over_runbook_348pg"], 1 / 20),
        "lethe_within_2x_bulk_348": at_most(ratios["lethe_over_bulk_348"], 2),
        "lethe_within_2x_bulk_348pg": at_most(ratios["lethe_over_bulk_348pg"], 2),
        "serve_30x_faster_than_runbook_348pg": at_most(ratios["serve_over_runbook_348pg"], 1 / 30),
        "lethe_15x_faster_than_runbook_348pg": at_most(ratios["lethe_over_runbook_348pg"], 1 / 15),
        "peak_rss_100k_rows_under_64_mib": None if not big else bool(big["ok"]) and big["peak_rss_kib"] / 1024 < 64,
        "all_runs_checked_ok": not failed,
    }
    with psycopg.connect(a.pg_url) as c:
        pg_version = c.execute("SHOW server_version").fetchone()[0]
    mem = next(int(line.split()[1]) // 1024 for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    result = {
        "benchmark": "postgres", "awake": a.awake,
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git": a.lethe_commit or (
            sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"]).stdout.strip()
            + ("-dirty" if sh(["git", "-C", REPO, "status", "--porcelain", "--", "crates", "Cargo.toml", "Cargo.lock"]).stdout.strip() else "")),
        "lethe_binary": {"path": lethe, "version": sh([lethe, "--version"]).stdout.strip(),
                         "mtime_utc": dt.datetime.fromtimestamp(os.path.getmtime(lethe), dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "machine": {"nproc": os.cpu_count(), "cpu": cpu, "mem_mib": mem, "kernel": platform.release(),
                    "python": platform.python_version(), "postgres": pg_version,
                    "redis": r0.info("server").get("redis_version")},
        "load_before": load_before, "load_after": load_after,
        "uptime_before": uptime_before, "uptime_after": uptime_after,
        "seed": seed, "runs_requested": a.runs, "journal": journal_url, "metadata_index": a.metadata_index,
        "transport": "unix-socket" if host.startswith("/") else "tcp-sslmode-prefer",
        "runbook_s": rb, "bulk_s": bk, "lethe_wall_s": lw, "lethe_job_s": lj, "lethe_peak_rss_mib": lr,
        "lethe_phases_median_s": lph, "serve_wall_s": sv, "serve_phases_median_s": sph,
        "serve_poll_s": a.serve_poll_ms / 1000, "serve_warm_subject": f"{WARM_TENANT}/{WARM_SUBJECT}" if server else None,
        "serve_peak_rss_mib": server_rss_kib / 1024 if server_rss_kib else None,
        "ratios": ratios, "verdict": verdict,
        "total_seconds": round(time.perf_counter() - t_start, 1),
        "runs": runs, "extra_runs": extra,
    }
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, f"postgres-{result['date_utc'].replace(':', '')}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    if not a.keep and not a.workdir:
        shutil.rmtree(work, ignore_errors=True)

    def mm(s, unit="s", k=3):
        return f"{s['median']:.{k}f} {unit} ({s['min']:.{k}f}-{s['max']:.{k}f})" if s else "n/a"

    def rt(x):
        return f"{x:.2f}x" if x is not None else "n/a"

    m = result["machine"]
    md = [f"Run {result['date_utc']} (commit {result['git']}); {len(ok('runbook'))}/{len(ok('bulk'))}/{len(ok('lethe'))}/{len(ok('serve'))} of "
          f"{a.runs} runs (runbook/bulk/lethe/serve) checked ok; {m['nproc']} CPUs ({m['cpu']}), {m['mem_mib']} MiB RAM, "
          f"PostgreSQL {m['postgres']}, Redis {m['redis']}{'; CPUs kept awake by nice-19 spinners (--awake)' if a.awake else ''}; "
          f"journal {journal_url}; metadata index {'ON' if a.metadata_index else 'off'}; "
          f"{'Unix socket, no TLS' if host.startswith('/') else 'TCP, sslmode=prefer'} on both sides.",
          f"uptime before: `{uptime_before}`; after: `{uptime_after}`.", "",
          "| seconds, median (min-max) | runbook.py | bulk_reference.py |", "|---|---|---|"]
    for key, name in (("step3", "step 3 (checkpoints)"), ("step4", "step 4 (store)"), ("step8", "step 8 (verification, as measured)"),
                      ("step8_pg", "step 8, PostgreSQL part alone (Redis stubbed)"), ("sum_348", "**steps 3+4+8**"),
                      ("sum_348pg", "**steps 3+4+8 (PostgreSQL part of 8)**"), ("sum_34", "steps 3+4"),
                      ("step6", "step 6 (Redis, not compared)"), ("process", "whole process (imports, connects, steps 3-8)")):
        md.append(f"| {name} | {mm(rb.get(key))} | {mm(bk.get(key))} |")
    md += ["", f"lethe erase, whole process: {mm(lw)}; peak RSS {mm(lr, 'MiB', 1)}.",
           "Lethe's phases (median s): " + ", ".join(f"{k} {v:.3f}" for k, v in lph.items()), "",
           f"Ratios (medians): lethe / runbook 3+4+8 = {rt(ratios['lethe_over_runbook_348'])} "
           f"(PostgreSQL part of 8: {rt(ratios['lethe_over_runbook_348pg'])}); "
           f"lethe / bulk 3+4+8 = {rt(ratios['lethe_over_bulk_348'])} (PostgreSQL part of 8: {rt(ratios['lethe_over_bulk_348pg'])}; "
           f"bulk 3+4 alone: {rt(ratios['lethe_over_bulk_34'])}).",
           "", f"Lethe's job alone, from its request journaled to its certificate (process started, connections "
           f"open, as the runbook's clock starts): {mm(lj)}; / runbook 3+4+8 = {rt(ratios['lethe_job_over_runbook_348'])} "
           f"(PostgreSQL part of 8: {rt(ratios['lethe_job_over_runbook_348pg'])}). The verdicts use the whole process."]
    if sv:
        fx = (lambda x: f"{1 / x:.1f}x faster" if x else "n/a")
        md += ["", f"Warm `lethe serve`, POST to COMPLETE with its certificate ({'polled every %g ms' % a.serve_poll_ms if a.serve_poll_ms > 0 else 'one GET with wait_ms'}): {mm(sv)}; "
               f"server peak RSS {server_rss_kib / 1024:.1f} MiB; its phases from the server log (median s): "
               + ", ".join(f"{k} {v:.3f}" for k, v in sph.items()) + ".",
               f"Against the runbook's PostgreSQL part (steps 3+4+8, Redis stubbed out of 8): serve "
               f"{fx(ratios['serve_over_runbook_348pg'])} (goal 30x), the cold `lethe erase` process "
               f"{fx(ratios['lethe_over_runbook_348pg'])} (goal 15x)."]
    for r in extra:
        md.append(f"{r['label']}: lethe {r.get('wall_s', float('nan')):.3f} s, peak RSS {r.get('peak_rss_kib', 0) / 1024:.1f} MiB, "
                  f"certificate {r.get('certificate_counts')}, rows {r.get('grow', {}).get('rows', '')}, "
                  f"{'ok' if r['ok'] else 'FAILED: ' + '; '.join(r['problems'])}; phases " + ", ".join(f"{k} {v:.3f}" for k, v in r.get("phases_s", {}).items()))
    md += ["", "Verdict: " + ", ".join(f"{k} {'NOT MEASURED' if v is None else 'MET' if v else 'MISSED'}"
                                      for k, v in verdict.items()),
           f"Results: {os.path.relpath(path, REPO)}; total {result['total_seconds']} s; failed runs: {len(failed)}."]
    print("\n".join(md))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
