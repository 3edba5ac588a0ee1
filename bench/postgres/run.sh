#!/usr/bin/env bash
# Issue 3's PostgreSQL benchmark, one command: builds lethe (release), makes sure the venv (the
# peer's LangGraph stack), a private PostgreSQL (scripts/pg start-bench) and Redis on 6379 are there,
# then runs run.py: the peer's seed.py --scenario scaled (PostgreSQL db lg + Redis db 0), then 5
# rounds of runbook.py / bulk_reference.py / lethe erase / a job POSTed to a warm lethe serve on a
# re-seeded target, each checked by the peer's verify.py; lethe once with the redis target too;
# lethe on a 100,000-row target.
# Writes bench/out/postgres-*.json and prints Markdown tables. About 10-12 minutes.
# Arguments go to run.py (--runs N, --no-seed, --big-threads N, --big-items N, --skip redis,big, --kinds,
# --metadata-index, --workdir DIR --keep). LETHE_BIN=path skips the build and benchmarks that binary instead.
# --unix-socket (first argument): every connection, the peer's and Lethe's, goes through the private
# server's Unix socket instead of TCP with TLS (an application on the database's own host).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x /usr/bin/time ] || { echo "missing: /usr/bin/time (apt-get install -y time)" >&2; exit 2; }
# A private PostgreSQL by default: the peer's seed.py drops database lg, and other benchmarks on
# this machine run it on the shared server. LETHE_BENCH_PG_URL points it elsewhere (e.g. the
# machine's 5432). Redis cannot be private: the peer's scripts hard-code 127.0.0.1:6379, db 0.
PG_URL="${LETHE_BENCH_PG_URL:-$(scripts/pg start-bench)}"
if [ "${1:-}" = "--unix-socket" ]; then
  shift
  [ -z "${LETHE_BENCH_PG_URL:-}" ] || { echo "--unix-socket is for the private server, not LETHE_BENCH_PG_URL" >&2; exit 2; }
  # The same server through its socket folder, percent-encoded as the URL's host.
  sock="${LETHE_PGBENCH_DATA:-/var/tmp/lethe-pgbench}"
  PG_URL="postgres://postgres@${sock//\//%2F}:${LETHE_PGBENCH_PORT:-54320}/postgres"
fi
redis-cli -p 6379 ping >/dev/null 2>&1 || scripts/redis start >/dev/null
if [ -z "${LETHE_BIN:-}" ]; then
  cargo build --release --locked --quiet -p lethe-cli
  LETHE_BIN=target/release/lethe
fi
PY="$(scripts/pg python)"
PEER="${LETHE_PEER_DIR:?set LETHE_PEER_DIR to the folder of the peer LangGraph runbook}"
PYTHONDONTWRITEBYTECODE=1 exec "$PY" bench/postgres/run.py --peer "$PEER" --pg-url "$PG_URL" --lethe "$LETHE_BIN" "$@"
