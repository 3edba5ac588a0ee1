#!/usr/bin/env bash
# Issue 27's attack benchmark, one command (about a minute): a local `lethe serve` (SQLite
# journal, the demo's targets) under two attacks from this machine's loopback, each bounded in
# count and time, with a runtime holding a valid token measured meanwhile.
# - body : 100 connections without a token each declare a 2 MiB body, send what the server
#          takes of it, and stall. Target: the server's RSS grows at most 10 MiB.
# - conns: 4,100 idle connections without a token opened within 2 s and held. Target: a
#          tokened request on a new connection is answered within 1 s at p99.
# Each attack runs beside a probe at rest first (the same probe, no attack), so the latency is
# also reported as a ratio to rest. Writes bench/out/attack-*.json and prints a summary.
# Env: LETHE_BIN (measure this binary instead of building one, e.g. an older commit's, for a
# before/after; LETHE_COMMIT then names its commit in the results), HOLD (seconds each attack is
# held, default 10), CONNS (default 4100),
# BODIES (default 100).
set -euo pipefail
cd "$(dirname "$0")/../.."
[ -n "${LETHE_BIN:-}" ] || cargo build --release --locked --quiet -p lethe-cli
LETHE=${LETHE_BIN:-$PWD/target/release/lethe}
mkdir -p bench/out
OUT=$PWD/bench/out/attack-$(date -u +%Y%m%dT%H%M%SZ).json
WORK=$(mktemp -d)
SERVER_PID=
cleanup() { [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"; }
trap cleanup EXIT
# Both ends of 4,100 connections live on this machine: the attacker's and the server's.
ulimit -n 20000 2>/dev/null || true

# shellcheck source=bench/lib/serve.sh
. bench/lib/serve.sh
serve_demo "$LETHE" "$WORK" 4
python3 bench/attack/attack.py --addr "$ADDR" --pid "$SERVER_PID" \
    --token-file "$WORK/d/runtime.token" --hold "${HOLD:-10}" \
    --conns "${CONNS:-4100}" --bodies "${BODIES:-100}" \
    --commit "${LETHE_COMMIT:-$(git rev-parse --short HEAD)}" --out "$OUT"
