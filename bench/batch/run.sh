#!/usr/bin/env bash
# Issue 33's batch benchmark, one command: builds lethe (release), makes sure the venv (the peer's
# LangGraph stack), a private PostgreSQL (scripts/pg start-bench) and Redis on 6379 are there,
# then runs run.py: the peer's seed.py --scenario scaled (PostgreSQL db lg + Redis db 0), one
# `lethe erase --batch` of 500 of the 1,000 subjects (t03/u0342 among them) with the PostgreSQL
# and Redis scan-mode targets, checked subject by subject; a fresh seed, then the peer's
# runbook.py on a sample of 20 of those subjects. Writes bench/out/batch-*.json and prints a
# Markdown table. About 20 minutes with a binary that runs the batch's jobs one after another.
# Arguments go to run.py (--batch N, --sample N, --no-seed, --skip runbook|lethe, --journal-pg,
# --memory N, --memory-targets all|pg, --workdir DIR --keep). LETHE_BIN=path skips the build and
# benchmarks that binary instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x /usr/bin/time ] || { echo "missing: /usr/bin/time (apt-get install -y time)" >&2; exit 2; }
# A private PostgreSQL, as bench/postgres: the peer's seed.py drops database lg. Redis cannot be
# private: the peer's scripts hard-code 127.0.0.1:6379, db 0.
PG_URL="${LETHE_BENCH_PG_URL:-$(scripts/pg start-bench)}"
redis-cli -p 6379 ping >/dev/null 2>&1 || scripts/redis start >/dev/null
if [ -z "${LETHE_BIN:-}" ]; then
  cargo build --release --locked --quiet -p lethe-cli
  LETHE_BIN=target/release/lethe
fi
PY="$(scripts/pg python)"
PEER="${LETHE_PEER_DIR:?set LETHE_PEER_DIR to the folder of the peer LangGraph runbook}"
PYTHONDONTWRITEBYTECODE=1 exec "$PY" bench/batch/run.py --peer "$PEER" --pg-url "$PG_URL" --lethe "$LETHE_BIN" "$@"
