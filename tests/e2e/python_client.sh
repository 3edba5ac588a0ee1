#!/usr/bin/env bash
# The Python gate client (clients/python) against a real `lethe serve`: unit tests of the SSE
# parser, then the client and the LangGraph example graph, each test class starting its own
# server on port 0 with a fresh SQLite journal. Prints the measured revocation-push latency.
#
# Needs: the venv of scripts/pg (LangGraph; the client itself is standard library only).
# LETHE_BIN overrides the binary (default: target/debug/lethe, built here).
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ -z "${LETHE_BIN:-}" ]; then
    cargo build --quiet --locked -p lethe-cli
    export LETHE_BIN=$PWD/target/debug/lethe
fi
PY=$(scripts/pg python)
cd clients/python
PYTHONPATH=. PYTHONDONTWRITEBYTECODE=1 "$PY" -m unittest -v \
    tests.test_sse tests.test_keepalive tests.test_gate tests.test_langgraph tests.test_postgres_store tests.test_sink_fence \
    tests.test_rerun_after_erasure tests.test_cache tests.test_crypto tests.test_lineage tests.test_tls
