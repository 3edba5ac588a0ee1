# A local `lethe serve` over the demo's targets, for the benchmarks that drive one (sourced, not
# run). `serve_demo LETHE WORK POOL [JOURNAL_URL]` writes the demo into WORK/d, a runtime token,
# and a [serve] section on 127.0.0.1:0, then starts the server in the background and sets
# SERVER_PID, ADDR (host:port) and TOKEN. The caller's cleanup kills SERVER_PID.
serve_demo() {
    local lethe=$1 work=$2 pool=$3 journal=${4:-}
    "$lethe" demo --dir "$work/d" >/dev/null
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/d/runtime.token")
    TOKEN=$(cat "$work/d/runtime.token")
    [ -z "$journal" ] || sed -i "s#^journal = .*#journal = \"$journal\"#" "$work/d/lethe.toml"
    cat >> "$work/d/lethe.toml" <<TOML

[serve]
listen = "127.0.0.1:0"
pool = $pool

[[serve.token]]
role = "runtime"
token_file = "runtime.token"
TOML
    "$lethe" --config "$work/d/lethe.toml" serve > "$work/serve.out" 2> "$work/serve.err" &
    SERVER_PID=$!
    for _ in $(seq 100); do grep -q Listening "$work/serve.out" 2>/dev/null && break; sleep 0.1; done
    ADDR=$(sed -n 's#^Listening on http://##p' "$work/serve.out")
    [ -n "$ADDR" ] || { cat "$work/serve.err" >&2; return 1; }
}
