#!/usr/bin/env bash
# Issue 2's SQLite benchmark, one command: builds lethe (release), then runs run.py, which seeds
# a 1,000-subject LangGraph deployment, times Lethe's whole job against a hand-written SQL floor
# on fresh copies, checks every run, writes bench/out/sqlite-*.json and prints a Markdown table.
# Arguments go to run.py (--runs N, --workdir DIR, --keep). LETHE_BIN=path skips the build and
# benchmarks that binary instead. Needs python3, sqlite3 (the CLI) and /usr/bin/time.
set -euo pipefail
cd "$(dirname "$0")/../.."
for tool in python3 sqlite3; do
  command -v "$tool" >/dev/null || { echo "missing: $tool (apt-get install -y $tool)" >&2; exit 2; }
done
[ -x /usr/bin/time ] || { echo "missing: /usr/bin/time (apt-get install -y time)" >&2; exit 2; }
if [ -z "${LETHE_BIN:-}" ]; then
  cargo build --release --locked --quiet -p lethe-cli
  LETHE_BIN=target/release/lethe
fi
exec python3 bench/sqlite/run.py --lethe "$LETHE_BIN" "$@"
