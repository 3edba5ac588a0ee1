# shellcheck shell=bash
# Helpers for scripts/redis (sourced, not run). Messages go to stderr so that stdout carries only
# results (URLs, ports, slot numbers). Nothing here writes to a Redis server.

log() { printf '%s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# timed NAME: when the script exits, log how long it ran and how it ended (to stderr).
# (A trap rather than a wrapper: calling a function as `f || ...` would switch off set -e in it.)
timed() {
    _timed_name="$1"
    _timed_t0=$(date +%s%N)
    # shellcheck disable=SC2154 # _rc is set inside the trap
    trap '_rc=$?; log "[scripts/redis] $_timed_name: $(awk -v a="$_timed_t0" -v b="$(date +%s%N)" "BEGIN { printf \"%.2f\", (b - a) / 1e9 }")s, exit $_rc"' EXIT
}

# rcli PORT [redis-cli options] COMMAND...: redis-cli against 127.0.0.1:PORT, raw replies.
# A server that accepts the connection but never answers does not hang the script.
RCLI_TIMEOUT="${RCLI_TIMEOUT:-20}"
rcli() {
    local port="$1"
    shift
    timeout "$RCLI_TIMEOUT" redis-cli -h 127.0.0.1 -p "$port" --no-auth-warning "$@"
}

# cluster_cli ARGS...: redis-cli --cluster ARGS, its report to stderr, without colour codes
# and without the two lines per slot that a reshard prints.
cluster_cli() {
    redis-cli --cluster "$@" 2>&1 | sed -u -e 's/\x1b\[[0-9;]*m//g' -e '/^ *Moving slot [0-9]* from /d' >&2
}

is_uint() { case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }
# pid_alive PID: the process exists and is not a zombie (a daemonized redis-server's parent is
# PID 1, which on these machines may take a second or two to reap it).
pid_alive() {
    local st
    st="$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null || true)"
    [ -n "$st" ] && [ "$st" != Z ]
}

# uint_in N LO HI: N is a decimal number from LO to HI.
uint_in() { is_uint "$1" && [ "${#1}" -le 9 ] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }

# nodes_table < CLUSTER NODES: one line per node, sorted by port:
#   PORT IP ID FLAGS LINK-STATE SLOT-RANGES...   (IP "-" when the node does not know it yet)
# Open-slot markers ([5->-id] migrating, [5-<-id] importing) are left out; see open_markers.
nodes_table() {
    awk '{
        addr = $2; sub(/@.*/, "", addr); n = split(addr, hp, ":")
        line = hp[n] " " (n > 1 && hp[1] != "" ? hp[1] : "-") " " $1 " " $3 " " $8
        for (i = 9; i <= NF; i++) if ($i !~ /^\[/) line = line " " $i
        print line
    }' | sort -n
}

# open_markers < CLUSTER NODES: the node's own open slots, one per line: "SLOT migrating ID" or
# "SLOT importing ID" (only the node itself reports them, on its "myself" line).
open_markers() {
    awk '$3 ~ /myself/ { for (i = 9; i <= NF; i++) if ($i ~ /^\[/) {
        m = substr($i, 2, length($i) - 2)
        if (split(m, a, "->-") == 2) print a[1], "migrating", a[2]
        else if (split(m, a, "-<-") == 2) print a[1], "importing", a[2]
    } }'
}

# slot_owner_port SLOT < nodes_table output: the port whose slot ranges hold SLOT (empty if none).
slot_owner_port() {
    awk -v s="$1" '{ for (i = 6; i <= NF; i++) {
        n = split($i, r, "-"); lo = r[1] + 0; hi = (n == 2 ? r[2] : r[1]) + 0
        if (s >= lo && s <= hi) { print $1; exit }
    } }'
}

# slots_of_port PORT < nodes_table output: every slot of the node on PORT, one per line.
slots_of_port() {
    awk -v p="$1" '$1 == p { for (i = 6; i <= NF; i++) {
        n = split($i, r, "-"); lo = r[1] + 0; hi = (n == 2 ? r[2] : r[1]) + 0
        for (s = lo; s <= hi; s++) print s
    } }'
}

# ranges < sorted slot numbers: "0-99" / "5" lines (CLUSTER NODES style).
ranges() {
    awk 'NR == 1 { lo = hi = $1; next }
         $1 == hi + 1 { hi = $1; next }
         { print (lo == hi ? lo : lo "-" hi); lo = hi = $1 }
         END { if (NR) print (lo == hi ? lo : lo "-" hi) }'
}
