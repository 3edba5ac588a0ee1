#!/usr/bin/env bash
# The runbook's validation scenario (section 10 of shared/reference/004_...): three subjects
# seeded by the peer's own seed.py through real LangGraph (PostgreSQL database lg_small, Redis
# db 1), a snapshot by the peer's verify.py, `lethe erase` of acme/alice over the PostgreSQL
# checkpointer, the PostgreSQL store and the Redis cache, a second snapshot, and the peer's
# `verify.py compare`: zero residue for alice, 100% kept for bob and carol. Exit 1 otherwise.
#
# Needs: PostgreSQL 15 on 127.0.0.1:5432, Redis on 127.0.0.1:6379 (the peer hard-codes both),
# the venv (scripts/pg venv) and a built lethe (LETHE_BIN, default target/debug/lethe).
set -euo pipefail
cd "$(dirname "$0")/../.."
LETHE=${LETHE_BIN:-target/debug/lethe}
PG=${LETHE_PG15_URL:-postgres://postgres@127.0.0.1:5432/postgres}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! scripts/pg peer "$PG" seed.py --scenario small >/dev/null 2>"$work/seed.log"; then
    echo "runbook validation: the peer's seed.py failed (is ../shared/peer/langgraph-runbook there? LETHE_PEER_DIR overrides):" >&2
    tail -20 "$work/seed.log" >&2
    exit 1
fi
scripts/pg peer "$PG" verify.py snapshot --scenario small --out "$work/before.json" >/dev/null

cat >"$work/lethe.toml" <<TOML
[control]
journal = "sqlite:journal.db"
policy_version = "validation-10"

[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "${PG%/*}/lg_small"
registry = { table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }
metadata = { tenant = "tenant_id", subject = "user_id" }

[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "${PG%/*}/lg_small"
namespace = ["{tenant}", "{subject}"]

[[target]]
name = "session-cache"
kind = "redis"
class = "cache"
url = "redis://127.0.0.1:6379/1"
pattern = "{tenant}:{subject}:*"
mode = "scan"
TOML

"$LETHE" --config "$work/lethe.toml" erase --tenant acme --subject alice \
    --basis gdpr-art17 --ticket VALIDATION-10 --drain-timeout 0 --json >"$work/erase.json"
scripts/pg peer "$PG" verify.py snapshot --scenario small --out "$work/after.json" >/dev/null
set +e
scripts/pg peer "$PG" verify.py compare --scenario small "$work/before.json" "$work/after.json" >"$work/compare.json"
rc=$?
set -e
python3 - "$work/erase.json" "$work/compare.json" <<'PY'
import json, sys
erase, cmp = (json.load(open(p)) for p in sys.argv[1:3])
counts = {t: v["count"] for t, v in (erase.get("certificate") or {}).get("targets", {}).items()}
print(f"runbook validation: lethe {erase['state']} {counts}; verify.py compare ok={cmp['ok']}, "
      f"other subjects untouched={cmp['non_target_users_untouched']}, changed={cmp['non_target_users_changed']}, "
      f"target before/after={cmp['target_before_after']}")
for p in cmp["problems"]:
    print("  problem:", p)
print("  note: LangGraph RedisCache entries holding the target's text after the erase:",
      cmp["langgraph_cache_keys_with_target_content_after"], "(keyed by node and input hash, not by subject: lineage is future work)")
PY
exit "$rc"
