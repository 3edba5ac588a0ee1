#!/usr/bin/env bash
# One index-mode erase of 5,000 keys, timed by phase: for quick before/after comparisons of
# the engine and the journal (not the benchmark of record: see run.py). Writes the subject's
# keys and index set into Redis db DB (default 15; it must hold nothing else of value: the
# keys t03:u0342:k1..k5000 and idx:t03:u0342 are overwritten), then runs
# `lethe -v erase` with a fresh SQLite journal and prints the wall time and the time to each
# log line. LETHE_BIN picks the binary (default target/release/lethe); RUNS (default 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
DB=${DB:-15}
LETHE=${LETHE_BIN:-$PWD/target/release/lethe}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat > "$WORK/lethe.toml" <<TOML
[control]
journal = "sqlite:journal.db"

[[target]]
name = "session-cache"
kind = "redis"
url = "redis://127.0.0.1:6379"
db = $DB
class = "cache"
pattern = "{tenant}:{subject}:*"
mode = "index"
index = "idx:{tenant}:{subject}"
TOML
for _ in $(seq "${RUNS:-1}"); do
  redis-cli -n "$DB" eval "for i=1,5000 do redis.call('set','t03:u0342:k'..i,'v'); redis.call('sadd','idx:t03:u0342','t03:u0342:k'..i) end return 1" 0 >/dev/null
  rm -rf "$WORK"/journal.db* "$WORK/certificates" "$WORK/lethe.key"
  (cd "$WORK" && "$LETHE" --config lethe.toml journal verify >/dev/null 2>&1)
  s=$(date +%s.%N)
  (cd "$WORK" && "$LETHE" --config lethe.toml -v erase --tenant t03 --subject u0342 --basis gdpr-art17 \
      --ticket BENCH-1 --drain-timeout 0 --json > out.json 2> err.log)
  e=$(date +%s.%N)
  python3 - "$s" "$e" "$WORK/err.log" <<'PY'
import datetime, re, sys
s, e = float(sys.argv[1]), float(sys.argv[2])
prev, out = s, []
for line in open(sys.argv[3]):
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    m = re.match(r"^(\S+)Z\s+INFO\s+(.*?)\.", line)
    if not m:
        continue
    t = datetime.datetime.fromisoformat(m.group(1)).replace(tzinfo=datetime.timezone.utc).timestamp()
    out.append(f"{m.group(2)} {(t - prev) * 1000:.1f}")
    prev = t
out.append(f"exit {(e - prev) * 1000:.1f}")
print(f"wall {(e - s) * 1000:.1f} ms | " + " | ".join(out))
PY
done
