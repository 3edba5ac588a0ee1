#!/usr/bin/env bash
# Issue 5's gate benchmark, one command (about 3 minutes): builds lethe and the driver
# (crates/server/examples/gate_bench.rs) in release, then alternates, ROUNDS times (default 3):
# - memory : take+release on the in-process gate (lethe-gate), one thread      target >= 500,000/s
# - inproc : take+release on the journal's gate (permits as rows), one thread, SQLite and PostgreSQL
# - http   : take+release over HTTP, 8 clients, `lethe serve` with the PostgreSQL journal
#            (a separate process, pool 8)                              target >= 5,000/s, p99 < 10 ms
# - http-swap : the same, each take carrying the release of the cycle before's permit (one
#            request a cycle instead of two; POST /v1/permits with `release`)
# - floor  : PostgreSQL alone: INSERT + UPDATE of one row per cycle, 8 clients (what a permit
#            costs the database at the least; there is no peer: the runbook has no gate)
# - floor-async : the same, the UPDATE on a second connection that does not wait for the WAL
#            flush, as `lethe serve` ends permits (the floor of the two-request form)
# - freeze : fence-close latency on PostgreSQL (each freeze revokes a lease, records a permit)
#            target p50 < 5 ms
# - revocation : from a freeze's commit to the `revoked` event on an open SSE stream of the
#            server                                                       target < 100 ms
# Writes bench/out/gate-*.jsonl (one JSON object per measurement) and prints medians.
# The HTTP measurement also samples the CPU used meanwhile by PostgreSQL, `lethe` and the
# driver (bench/gate/cpu.py) and reports it per cycle.
# Env: ROUNDS, SECS (per measurement, default 5), HTTP_CLIENTS (default "8"; "8 32" also runs
# 32 clients, reported as http-postgres-c32), LETHE_PG15_URL (admin URL), LETHE_BIN (time
# this lethe binary instead of building one, e.g. an older commit's, for a before/after),
# ONLY_HTTP=1 (only the HTTP clients and the floor: a quicker before/after of the server),
# CARGO_TARGET_DIR (where the builds go, as for cargo), GATE_BENCH_DB (the database, default
# lethe_gate_bench; dropped and created at the start, so two runs at once need two names).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
HTTP_CLIENTS=${HTTP_CLIENTS:-8}
SECS=${SECS:-5}
ADMIN=${LETHE_PG15_URL:-postgres://postgres@127.0.0.1:5432/postgres}
# Loopback: TLS would protect nothing here and costs the server and PostgreSQL ~8% CPU.
DB=${GATE_BENCH_DB:-lethe_gate_bench}
PG="${ADMIN%/*}/$DB?sslmode=disable"
[ -n "${LETHE_BIN:-}" ] || cargo build --release --locked --quiet -p lethe-cli
cargo build --release --locked --quiet -p lethe-server --example gate_bench
TARGET=$(realpath -m "${CARGO_TARGET_DIR:-target}")
LETHE=${LETHE_BIN:-$TARGET/release/lethe}
DRIVER=$TARGET/release/examples/gate_bench
mkdir -p bench/out
OUT=$PWD/bench/out/gate-$(date -u +%Y%m%dT%H%M%SZ).jsonl
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT

psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB" >/dev/null
# `lethe serve` needs a target to start; the demo's fixtures serve (no job runs here).
# shellcheck source=bench/lib/serve.sh
. bench/lib/serve.sh
serve_demo "$LETHE" "$WORK" 8 "$PG"

# What autovacuum does between a deployment's bursts, done here before each PostgreSQL
# measurement: the machine's PostgreSQL 15 runs with autovacuum off, and without it the permit
# rows every round leaves behind (dead after their release) made each round slower than the
# last (PostgreSQL's CPU per HTTP cycle grew by about 40% a round).
vacuum() { psql "$PG" -qc "VACUUM ANALYZE" >/dev/null; }
run() { # label, driver args...
  local label=$1; shift
  "$DRIVER" "$@" | python3 -c "import json,sys; d=json.load(sys.stdin); d['label']='$label'; d['load']=open('/proc/loadavg').read().split()[0]; print(json.dumps(d))" | tee -a "$OUT"
}
run_http() { # mode (http or http-swap), clients; like run, with the CPU of each program per cycle (microseconds)
  local label=http-postgres
  [ "$1" = http ] || label=$label-swap
  [ "$2" = 8 ] || label=$label-c$2
  python3 bench/gate/cpu.py 1 $((SECS > 2 ? SECS - 2 : 1)) > "$WORK/cpu.json" &
  local cpu=$!
  "$DRIVER" "$1" "$ADDR" "$TOKEN" "$2" "$SECS" > "$WORK/http.json"
  wait "$cpu"
  python3 - "$WORK/http.json" "$WORK/cpu.json" "$label" <<'PY' | tee -a "$OUT"
import json, sys
d = json.load(open(sys.argv[1])); cpu = json.load(open(sys.argv[2]))
d['label'] = sys.argv[3]; d['load'] = open('/proc/loadavg').read().split()[0]
n = d['cycles_per_s']
# By program name's start: LETHE_BIN may be a copy named lethe-old or lethe-new.
d['cpu_us_per_cycle'] = {k: round(sum(v for p, v in cpu.items() if p.startswith(k)) / n * 1e6) for k in ('postgres', 'lethe', 'gate_bench')}
print(json.dumps(d))
PY
}
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
# With ONLY_HTTP, a second of in-process permits first (not recorded), so the first HTTP round
# does not run on plans made for empty tables (the full run has inproc-postgres before it):
# measured, the first round then ran at half the rate of the second.
[ -z "${ONLY_HTTP:-}" ] || "$DRIVER" inproc "$PG" 1 >/dev/null
for r in $(seq "$ROUNDS"); do
  echo "== round $r" >&2
  rm -f "$WORK/mem.db" "$WORK/inproc.db"
  if [ -z "${ONLY_HTTP:-}" ]; then
    run memory memory "sqlite:$WORK/mem.db" "$SECS"
    run inproc-sqlite inproc "sqlite:$WORK/inproc.db" "$SECS"
    vacuum; run inproc-postgres inproc "$PG" "$SECS"
  fi
  # The two forms alternate, each round starting with the other.
  modes="http http-swap"; [ $((r % 2)) = 1 ] || modes="http-swap http"
  for c in $HTTP_CLIENTS; do for m in $modes; do vacuum; run_http "$m" "$c"; done; done
  vacuum; run floor-postgres floor "$PG" 8 "$SECS"
  vacuum; run floor-postgres-async floor "$PG" 8 "$SECS" async
  if [ -z "${ONLY_HTTP:-}" ]; then
    run freeze-postgres freeze "$PG" 300
    run revocation-push revocation "$ADDR" "$TOKEN" "$PG" 100
  fi
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
python3 - "$OUT" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["label"], []).append(r)
print(f"\n{'measurement':18} {'cycles/s median (min-max)':>34} {'p50 us':>9} {'p99 us':>9}  load")
for label, rs in by.items():
    c = [r["cycles_per_s"] for r in rs]
    p50 = statistics.median(r["p50_us"] for r in rs)
    p99 = statistics.median(r["p99_us"] for r in rs)
    print(f"{label:18} {statistics.median(c):14,.0f} ({min(c):,.0f}-{max(c):,.0f}) {p50:9.1f} {p99:9.1f}  {','.join(r['load'] for r in rs)}")
floor = statistics.median(r["cycles_per_s"] for r in by["floor-postgres"])
floor_async = statistics.median(r["cycles_per_s"] for r in by["floor-postgres-async"])
for label in ("http-postgres", "http-postgres-swap"):
    http = statistics.median(r["cycles_per_s"] for r in by[label])
    cpu = {k: statistics.median(r["cpu_us_per_cycle"][k] for r in by[label]) for k in ("postgres", "lethe", "gate_bench")}
    print(f"{label} / floor = {http / floor:.2f} (/ floor-async = {http / floor_async:.2f}); CPU per cycle (us, median): {cpu}")
print(f"results in {sys.argv[1]}")
PY
