#!/usr/bin/env bash
# bench/chroma: erase a subject with 2,000 documents among 200,000 in a Chroma collection,
# through Lethe's `chroma` adapter and through Chroma's own delete(where=...), on the same data
# in one run (bench/README.md, "Chroma"). Options go to bench.py (--docs, --subject-docs, --dim).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
URL=$(scripts/chroma start)
PY=$(scripts/chroma python)
cargo build --release --quiet -p lethe-adapters --example chroma_bench
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/chroma_bench"
mkdir -p bench/out
exec "$PY" bench/chroma/bench.py --url "$URL" --bench-bin "$BIN" \
    --out "bench/out/chroma-$(date -u +%Y%m%dT%H%M%SZ).json" "$@"
