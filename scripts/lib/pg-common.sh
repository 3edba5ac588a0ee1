# shellcheck shell=bash
# Helpers shared by scripts/pg (sourced, not run). Messages go to stderr so that stdout carries
# only results (URLs, manifests).

log() { printf '%s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# timed NAME: when the script exits, log how long it ran and how it ended (to stderr).
# (A trap rather than a wrapper: calling a function as `f || ...` would switch off set -e in it.)
timed() {
    _timed_name="$1"
    _timed_t0=$(date +%s%N)
    # shellcheck disable=SC2154 # _rc is set inside the trap
    trap '_rc=$?; log "[scripts/pg] $_timed_name: $(awk -v a="$_timed_t0" -v b="$(date +%s%N)" "BEGIN { printf \"%.2f\", (b - a) / 1e9 }")s, exit $_rc"' EXIT
}
