#!/usr/bin/env bash
# Issue 4's Redis benchmark, one command: builds lethe (release), makes sure the venv (redis-py,
# the peer's LangGraph stack) and Redis on 127.0.0.1:6379 are there, then runs run.py: scan mode
# against the runbook's step 6 and a redis-cli floor in db 0 (the peer's scaled keyspace, seeded
# by the peer's seed.py if db 0 is not it), a second client's GET p99 during the erase, and
# index mode at 100,000 / 1,000,000 / 5,000,000 keys in scratch dbs (default 12, 13, 14, flushed at the
# end). Writes bench/out/redis-*.json and prints Markdown tables. About 5 minutes.
# Arguments go to run.py (--runs N, --lat-rounds N, --index-runs N, --sizes A,B,C,
# --scratch-dbs A,B,C, --scan-db N, --scan-variants, --lat-variants, --variant NAME=LINES,
# --index-journal fresh|kept, --skip scan,latency,index, --workdir DIR --keep). LETHE_BIN=path skips the
# build and benchmarks that binary instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in redis-cli xargs; do
  command -v "$tool" >/dev/null || { echo "missing: $tool (apt-get install -y redis-tools)" >&2; exit 2; }
done
[ -x /usr/bin/time ] || { echo "missing: /usr/bin/time (apt-get install -y time)" >&2; exit 2; }
redis-cli -p 6379 ping >/dev/null 2>&1 || scripts/redis start >/dev/null
if [ -z "${LETHE_BIN:-}" ]; then
  cargo build --release --locked --quiet -p lethe-cli
  LETHE_BIN=target/release/lethe
fi
PY="$(scripts/pg python)"
PEER="${LETHE_PEER_DIR:?set LETHE_PEER_DIR to the folder of the peer LangGraph runbook}"
PYTHONDONTWRITEBYTECODE=1 exec "$PY" bench/redis/run.py --peer "$PEER" --lethe "$LETHE_BIN" "$@"
