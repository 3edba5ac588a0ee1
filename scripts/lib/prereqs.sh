# What scripts/test needs from the machine (sourced, not run): the programs, each with the
# Debian package that brings it. As root with apt-get, the missing ones are installed; a
# PostgreSQL installed here gets the machine's test setup (trust for 127.0.0.1, started, on
# 5432). Otherwise each missing package is named and the caller exits 2 before running anything.
# cargo itself is assumed (the README's first step is a Rust toolchain).

# program package
LETHE_PREREQS="
pg_ctlcluster postgresql
pg_isready postgresql-client
psql postgresql-client
redis-server redis-server
redis-cli redis-tools
openssl openssl
flock util-linux
chromium chromium
chromedriver chromium-driver
"

# Missing packages, one a line, deduplicated; python3.11 with venv and ensurepip is checked
# by scripts/pg itself (it installs python3-venv as root).
missing_packages() {
    local prog pkg
    while read -r prog pkg; do
        [ -n "$prog" ] || continue
        command -v "$prog" >/dev/null 2>&1 || echo "$pkg"
    done <<<"$LETHE_PREREQS" | sort -u
    if ! command -v python3.11 >/dev/null 2>&1 && [ ! -x /usr/bin/python3.11 ] &&
        ! ls "$HOME"/.pyenv/versions/3.11*/bin/python3.11 >/dev/null 2>&1; then
        echo python3
        echo python3-venv
    fi
}

# Installs (root) or names (otherwise) what is missing; returns 2 when something is still missing.
ensure_prereqs() {
    local missing installed_pg=
    missing="$(missing_packages)"
    [ -n "$missing" ] || return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "scripts/test: missing packages (install them, e.g. as root: apt-get install -y $(echo $missing)):" >&2
        sed 's/^/  - /' <<<"$missing" >&2
        return 2
    fi
    echo "scripts/test: installing Debian's $(echo $missing)" >&2
    grep -qx postgresql <<<"$missing" && installed_pg=1
    apt-get update -qq >/dev/null
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >/dev/null
    if [ -n "$installed_pg" ]; then
        # The tests connect as postgres to 127.0.0.1:5432 without a password, as on the
        # machines this project runs on: trust for loopback TCP, on a server installed just now.
        local v conf
        v="$(basename "$(find /etc/postgresql -mindepth 1 -maxdepth 1 | sort -V | tail -n 1)")"
        conf="/etc/postgresql/$v/main/pg_hba.conf"
        sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+$/\1trust/' "$conf"
        pg_ctlcluster --skip-systemctl-redirect "$v" main restart >/dev/null 2>&1 ||
            pg_ctlcluster --skip-systemctl-redirect "$v" main start
    fi
    missing="$(missing_packages)"
    if [ -n "$missing" ]; then
        echo "scripts/test: still missing after apt-get: $(echo $missing)" >&2
        return 2
    fi
}
