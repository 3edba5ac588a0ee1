#!/usr/bin/env bash
# The database guard's stale-writer fault test through real LangGraph (issue 5), on
# PostgreSQL 15 and 18: a worker process that read acme/alice's memory before the erasure writes
# after it with PostgresSaver.put, put_writes, a compiled graph and PostgresStore.put. The worker
# connects as its own role, with rights on LangGraph's tables only, as an application would.
# Every write is refused by the database, the erased thread and item stay gone, a fresh run with
# the new epoch writes again, and every other subject keeps every row byte for byte
# (tests/e2e/guard_stale_writer.py says exactly what is checked).
#
# Ordering is by handshakes, never sleeps: the worker and this script meet at FIFOs, and
# `lethe erase` is held inside its job (between FROZEN and COMPLETE) by LETHE_TEST_PAUSE_AT,
# whose marker is a FIFO too.
#
# Needs: the servers and template of scripts/test (LETHE_PG15_URL, LETHE_PG18_URL,
# LETHE_PG_TEMPLATE), the venv (scripts/pg venv), psql, and a built lethe (LETHE_BIN, default
# target/debug/lethe, built here with the test-pause feature). Exit 1 when a check fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
# The binary holds the test pause points only when built with the test-pause feature (a plain
# `cargo build` leaves them out).
if [ -z "${LETHE_BIN:-}" ]; then
    cargo build --quiet --locked -p lethe-cli --features test-pause
fi
LETHE=${LETHE_BIN:-target/debug/lethe}
TEMPLATE=${LETHE_PG_TEMPLATE:-lethe_tpl}
PY=$(scripts/pg python)
urls=("${LETHE_PG15_URL:-postgres://postgres@127.0.0.1:5432/postgres}" "${LETHE_PG18_URL:-postgres://postgres@127.0.0.1:54318/postgres}")
status=0

# Blocks until the other side opens the FIFO; a side that died fails the test instead of hanging.
meet() {
    timeout 300 cat "$1" >/dev/null || { echo "guard stale writer: no handshake on $(basename "$1") (a side died; see above)" >&2; return 1; }
}

one() {
    local admin=$1 work db url app app_url lethe_pid worker_pid job epoch rc
    work=$(mktemp -d)
    db="lethe_guard_e2e_$$_${RANDOM}"
    url="${admin%/*}/$db"
    # The stale worker is the application: its own role, with rights on LangGraph's tables only
    # (none on lethe_guard), as a deployment runs it. Lethe installs and runs as the admin.
    app="lethe_e2e_app_$$_${RANDOM}"
    app_url="${url/postgres@/$app@}"
    # One subshell per server (see the loop), so this cleanup runs when it exits, however.
    # shellcheck disable=SC2064
    trap "[ -n \"\${lethe_pid:-}\" ] && kill -9 \$lethe_pid; [ -n \"\${worker_pid:-}\" ] && kill -9 \$worker_pid; psql -qX '$admin' -c 'DROP DATABASE IF EXISTS $db WITH (FORCE)' -c 'DROP ROLE IF EXISTS $app' >/dev/null 2>&1; rm -rf '$work'" EXIT
    psql -qX "$admin" -c "CREATE DATABASE $db TEMPLATE $TEMPLATE" -c "CREATE ROLE $app LOGIN" >/dev/null
    psql -qX "$url" -c "GRANT USAGE ON SCHEMA public TO $app" \
        -c "GRANT SELECT, INSERT, UPDATE ON ALL TABLES IN SCHEMA public TO $app" >/dev/null
    cat >"$work/lethe.toml" <<TOML
[control]
journal = "sqlite:journal.db"
policy_version = "guard-e2e"

[serve]
listen = "127.0.0.1:0"

[[serve.token]]
role = "runtime"
token_file = "runtime.token"

[[target]]
name = "checkpoints"
kind = "langgraph-postgres-checkpointer"
class = "primary"
url = "$url"
registry = { table = "public.thread_registry", tenant = "tenant_id", subject = "user_id", thread = "thread_id" }
metadata = { tenant = "tenant_id", subject = "user_id" }

[[target]]
name = "memories"
kind = "langgraph-postgres-store"
class = "primary"
url = "$url"
namespace = ["{tenant}", "{subject}"]
TOML
    (umask 077 && "$PY" -c 'import secrets; print("rt-" + secrets.token_hex(16))' >"$work/runtime.token")
    "$LETHE" --config "$work/lethe.toml" guard install --target checkpoints --json >/dev/null
    "$LETHE" --config "$work/lethe.toml" guard install --target memories --json >/dev/null
    mkfifo "$work/ready-a" "$work/go-b" "$work/ready-b" "$work/go-c" "$work/paused"

    [ "$app_url" != "$url" ] || { echo "guard stale writer: the admin URL must name user postgres" >&2; return 1; }
    "$PY" tests/e2e/guard_stale_writer.py --dsn "$app_url" --dir "$work" >"$work/result.json" &
    worker_pid=$!
    meet "$work/ready-a"                                 # phase A done: the stale run wrote

    LETHE_TEST_PAUSE_AT=after-inventory LETHE_TEST_PAUSE_FILE="$work/paused" \
        "$LETHE" --config "$work/lethe.toml" erase --tenant acme --subject alice \
        --basis gdpr-art17 --ticket GUARD-E2E --drain-timeout 0 --json >/dev/null 2>&1 &
    lethe_pid=$!
    meet "$work/paused"                                 # the job is FROZEN, fence closed
    "$LETHE" --config "$work/lethe.toml" guard status --json >"$work/status-frozen.json"
    echo go >"$work/go-b"
    meet "$work/ready-b"                                # phase B done
    kill -9 "$lethe_pid"; wait "$lethe_pid" 2>/dev/null || true; lethe_pid=

    job=$("$LETHE" --config "$work/lethe.toml" jobs --json | "$PY" -c 'import json,sys; print(json.load(sys.stdin)[0]["job_id"])')
    "$LETHE" --config "$work/lethe.toml" resume "$job" --drain-timeout 0 --json >"$work/resume.json"
    "$LETHE" --config "$work/lethe.toml" job show "$job" --json >"$work/job.json"
    epoch=$("$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); assert j["state"]=="COMPLETE", j["state"]; print(j["subject_epoch"])' "$work/job.json")
    echo "$epoch" >"$work/epoch"
    # Leases the gate issues after the erasure (alice's and bob's), with their tokens: what a
    # runtime that leased after the erasure carries.
    LETHE_BIN="$LETHE" "$PY" tests/e2e/guard_stale_writer.py --take-leases "$work/lethe.toml" "$work/leases.json"
    "$LETHE" --config "$work/lethe.toml" guard status --json >"$work/status-complete.json"
    echo go >"$work/go-c"
    set +e
    wait "$worker_pid"; rc=$?
    set -e
    worker_pid=
    "$PY" - "$work" "$admin" "$rc" <<'PY'
import json, sys
from pathlib import Path
w, admin, rc = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
frozen = json.loads((w / "status-frozen.json").read_text())
done = json.loads((w / "status-complete.json").read_text())
res = json.loads((w / "result.json").read_text() or '{"ok": false, "checks": []}')
fenced = frozen["checkpoints"]["fenced_subjects"]
reopened = done["checkpoints"]["fenced_subjects"]
ok = rc == 0 and res["ok"] and fenced == 1 and reopened == 0
print(f"guard stale writer on {admin.rsplit('@', 1)[-1]}: {'ok' if ok else 'FAILED'}; "
      f"{sum(c['ok'] for c in res['checks'])}/{len(res['checks'])} checks; fenced while FROZEN={fenced}, after COMPLETE={reopened}; "
      f"erased threads={done['checkpoints']['erased_threads']}, items={done['memories']['erased_items']}; "
      f"known limits: {res.get('known_limits')}")
for c in res["checks"]:
    if not c["ok"]:
        print("  FAILED:", c["check"], c.get("detail", ""))
sys.exit(0 if ok else 1)
PY
}

for u in "${urls[@]}"; do
    (one "$u") || status=1
done
exit "$status"
