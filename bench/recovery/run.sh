#!/usr/bin/env bash
# Issue 31's recovery benchmark, one command: builds lethe (release), makes sure Redis on
# 127.0.0.1:6379 and the venv (redis-py and the peer's imports, for the peer's side) are there,
# then runs run.py: N erasures journaled by `lethe erase`, the erased subjects' keys restored,
# then `lethe recovery` against the peer runbook's step 6 looped over the same subjects, each
# on the same restored store and checked. Redis db 13 by default (--db N): flushed at the
# start and at the end. Writes bench/out/recovery-*.json and prints a Markdown table.
# Arguments go to run.py (--n N, --others N, --keys N, --db N, --rounds N, --parallel N,
# --skip peer, --workdir DIR --keep, --lethe-commit REV). LETHE_BIN=path skips the build and
# benchmarks that binary instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -x /usr/bin/time ] || { echo "missing: /usr/bin/time (apt-get install -y time)" >&2; exit 2; }
redis-cli -p 6379 ping >/dev/null 2>&1 || scripts/redis start >/dev/null
if [ -z "${LETHE_BIN:-}" ]; then
  cargo build --release --locked --quiet -p lethe-cli
  LETHE_BIN="${CARGO_TARGET_DIR:-target}/release/lethe"
fi
PY="$(scripts/pg python)"
PEER="${LETHE_PEER_DIR:?set LETHE_PEER_DIR to the folder of the peer LangGraph runbook}"
PYTHONDONTWRITEBYTECODE=1 exec python3 bench/recovery/run.py --peer "$PEER" --peer-python "$PY" \
  --lethe "$LETHE_BIN" "$@"
