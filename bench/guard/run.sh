#!/usr/bin/env bash
# The database guard's overhead on LangGraph's own checkpoint and store writes (issue 5's
# target: under 10%). Builds lethe (release) unless LETHE_BIN is set, then runs run.py with the
# pinned LangGraph venv; options go to run.py (--url, --rounds, --ops). See bench/README.md.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${LETHE_BIN:-}" ]; then
    cargo build --release --quiet -p lethe-cli
    export LETHE_BIN=$PWD/target/release/lethe
fi
exec "$(scripts/pg python)" bench/guard/run.py "$@"
