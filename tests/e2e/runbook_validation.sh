#!/usr/bin/env bash
# The runbook's validation scenario: subjects written through real LangGraph into PostgreSQL,
# a session cache in Redis, `lethe erase` of acme/alice over the PostgreSQL checkpointer, the
# PostgreSQL store, the Redis session cache, LangGraph's node cache (legacy entries flushed) and,
# where LETHE_CHROMA_URL names a server, a Chroma collection of the subjects' memories, where
# LETHE_PHOENIX_URL names one, Phoenix traces of the subjects' runs (with LETHE_CHROMA_DATA and
# LETHE_PHOENIX_DATA, their folders, for the physical-residue report), and a comparison of snapshots taken before and after:
# zero residue for alice, every row and key of every other subject kept, byte for byte.
#
# 1. The project's own data (always): `scripts/pg seed-small` (three subjects of the runbook's
#    small scenario plus subjects with awkward identifiers) into database lethe_validation,
#    Redis db 3 (flushed first), snapshots and comparison by tests/e2e/validation.py.
# 2. The peer runbook's own seed.py and verify.py (database lg_small, Redis db 1), when
#    LETHE_PEER_DIR names its folder. Skipped, and said, otherwise.
#
# Needs: PostgreSQL 15 on 127.0.0.1:5432 (LETHE_PG15_URL), Redis on 127.0.0.1:6379, the venv
# (scripts/pg venv) and a built lethe (LETHE_BIN, default target/debug/lethe). Exit 1 on any
# residue or collateral.
set -euo pipefail
cd "$(dirname "$0")/../.."
LETHE=${LETHE_BIN:-target/debug/lethe}
PG=${LETHE_PG15_URL:-postgres://postgres@127.0.0.1:5432/postgres}
PY=$(scripts/pg python)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# lethe.toml over database DB and Redis db N.
config() {
    cat >"$work/lethe.toml" <<TOML
[control]
journal = "sqlite:journal-$1.db"
policy_version = "validation-10"

[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "${PG%/*}/$1"
registry = { table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }
metadata = { tenant = "tenant_id", subject = "user_id" }

[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "${PG%/*}/$1"
namespace = ["{tenant}", "{subject}"]

[[target]]
name = "session-cache"
kind = "redis"
class = "cache"
url = "redis://127.0.0.1:6379/$2"
pattern = "{tenant}:{subject}:*"
mode = "scan"

[[target]]
name = "node-cache"
kind = "langgraph-redis-cache"
class = "cache"
url = "redis://127.0.0.1:6379/$2"
legacy = "flush"
TOML
    if [ -n "${3:-}" ]; then
        cat >>"$work/lethe.toml" <<TOML

[[target]]
name = "recall-index"
kind = "chroma"
class = "vector-index"
url = "$3"
collection = "lethe_validation_memories"
metadata = { tenant = "tenant_id", subject = "user_id" }
TOML
        if [ -n "${LETHE_CHROMA_DATA:-}" ]; then
            echo "path = \"$LETHE_CHROMA_DATA\"" >>"$work/lethe.toml"
        fi
    fi
    if [ -n "${4:-}" ]; then
        cat >>"$work/lethe.toml" <<TOML

[[target]]
name = "agent-traces"
kind = "phoenix"
class = "trace"
url = "$4"
project = "lethe-validation-traces"
metadata = { tenant = "tenant_id", subject = "user_id" }
verify_timeout_ms = 30000
TOML
        if [ -n "${LETHE_PHOENIX_DATA:-}" ]; then
            echo "path = \"$LETHE_PHOENIX_DATA\"" >>"$work/lethe.toml"
        fi
    fi
}

erase_alice() {
    "$LETHE" --config "$work/lethe.toml" erase --tenant acme --subject alice \
        --basis gdpr-art17 --ticket VALIDATION-10 --drain-timeout 0 --json >"$work/erase-$1.json"
    "$PY" - "$work/erase-$1.json" "$1" <<'PY'
import json, sys
erase = json.load(open(sys.argv[1]))
targets = (erase.get("certificate") or {}).get("targets", {})
counts = {t: v["count"] for t, v in targets.items()}
legacy = {t: v["legacy"] for t, v in targets.items() if "legacy" in v}
physical = {t: v["physical"] for t, v in targets.items() if "physical" in v}
print(f"runbook validation ({sys.argv[2]}): lethe {erase['state']} {counts}, legacy node-cache entries {legacy}")
if physical:
    print(f"runbook validation ({sys.argv[2]}): physical residue {physical}")
sys.exit(0 if erase["state"] == "COMPLETE" else 1)
PY
}

# 1. The project's own data.
scripts/pg seed-small "$PG" lethe_validation --manifest "$work/manifest.json" >/dev/null
"$PY" tests/e2e/validation.py redis-seed "$work/manifest.json" redis://127.0.0.1:6379/3
# A Chroma collection too, where a Chroma server runs (scripts/test starts one: LETHE_CHROMA_URL).
CHROMA=${LETHE_CHROMA_URL:-}
if [ -n "$CHROMA" ]; then
    "$PY" tests/e2e/validation.py chroma-seed "$work/manifest.json" "$CHROMA"
else
    echo "runbook validation: LETHE_CHROMA_URL is not set: no Chroma collection in the scenario"
fi
# Phoenix traces too, where a Phoenix server runs (scripts/test starts one: LETHE_PHOENIX_URL).
PHOENIX=${LETHE_PHOENIX_URL:-}
if [ -n "$PHOENIX" ]; then
    "$PY" tests/e2e/validation.py phoenix-seed "$work/manifest.json" "$PHOENIX"
else
    echo "runbook validation: LETHE_PHOENIX_URL is not set: no Phoenix traces in the scenario"
fi
snap() {
    "$PY" tests/e2e/validation.py snapshot "$work/manifest.json" "${PG%/*}/lethe_validation" \
        redis://127.0.0.1:6379/3 "$work/$1.json" "$CHROMA" "$PHOENIX"
}
snap own-before
config lethe_validation 3 "$CHROMA" "$PHOENIX"
erase_alice own
snap own-after
"$PY" tests/e2e/validation.py compare "$work/manifest.json" "$work/own-before.json" \
    "$work/own-after.json" acme alice

# 2. The peer runbook's seed.py and verify.py, where the peer is.
if [ -z "${LETHE_PEER_DIR:-}" ]; then
    echo "runbook validation: LETHE_PEER_DIR is not set: the peer runbook's own seed.py and verify.py were not run"
    exit 0
fi
[ -f "$LETHE_PEER_DIR/seed.py" ] || { echo "runbook validation: no seed.py in LETHE_PEER_DIR ($LETHE_PEER_DIR)" >&2; exit 1; }
if ! scripts/pg peer "$PG" seed.py --scenario small >/dev/null 2>"$work/seed.log"; then
    echo "runbook validation: the peer's seed.py failed:" >&2
    tail -20 "$work/seed.log" >&2
    exit 1
fi
scripts/pg peer "$PG" verify.py snapshot --scenario small --out "$work/before.json" >/dev/null
# The config the project ships for this scenario, copied to a working folder.
cp examples/runbook-small.toml "$work/lethe.toml"
erase_alice peer
scripts/pg peer "$PG" verify.py snapshot --scenario small --out "$work/after.json" >/dev/null
scripts/pg peer "$PG" verify.py compare --scenario small "$work/before.json" "$work/after.json" >"$work/compare.json" || true
# The peer's compare expects Redis to shrink by the target's keys only; `legacy = "flush"` also
# erased every legacy node-cache entry, which the certificate counts. That difference, and only
# it, is accepted.
python3 - "$work/compare.json" "$work/erase-peer.json" <<'PY'
import json, re, sys
cmp = json.load(open(sys.argv[1]))
legacy = json.load(open(sys.argv[2]))["certificate"]["targets"]["node-cache"]["legacy"]["count"]
print(f"runbook validation (peer): verify.py compare ok={cmp['ok']}, "
      f"other subjects untouched={cmp['non_target_users_untouched']}, changed={cmp['non_target_users_changed']}, "
      f"target before/after={cmp['target_before_after']}")
problems = []
for p in cmp["problems"]:
    m = re.fullmatch(r"redis dbsize (\d+) != expected (\d+)", p)
    if m and int(m[2]) - int(m[1]) == legacy:
        print(f"  accepted: {p}: the {legacy} legacy node-cache entries the certificate says were flushed")
    else:
        problems.append(p)
        print("  problem:", p)
cache_left = cmp["langgraph_cache_keys_with_target_content_after"]
print("  LangGraph RedisCache entries holding the target's text after the erase:", cache_left)
sys.exit(1 if problems or cache_left or cmp["non_target_users_changed"] else 0)
PY
