#!/usr/bin/env bash
# Create (or bring up to date) .venv with Duetime and its development tools.
# Idempotent and quick when nothing changed: pip runs only when pyproject.toml changed since the
# last successful install, or when the package cannot be imported.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: $*" >&2; }

python=""
for candidate in ${PYTHON:-} python3.11 python3.12 python3.13 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
        "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
        python="$candidate"
        break
    fi
done
if [ -z "$python" ]; then
    say "Python 3.11 or newer is needed (Debian: apt-get install python3 python3-venv)"
    exit 1
fi

if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $python"
    if ! "$python" -m venv .venv; then
        rm -rf .venv
        say "could not create a virtual environment (Debian: apt-get install python3-venv)"
        exit 1
    fi
fi

stamp=.venv/.duetime-installed
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ] || ! .venv/bin/python -c 'import duetime.app' 2>/dev/null; then
    say "installing Duetime (the server extra) and its development tools into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[server,dev]'
    echo "$wanted" >"$stamp"
fi

# `duetime run` without DUETIME_DATABASE_URL needs the PostgreSQL server programs.
have_pg_server() {
    command -v initdb >/dev/null 2>&1 && return 0
    for bindir in /usr/lib/postgresql/*/bin; do
        [ -x "$bindir/initdb" ] && [ -x "$bindir/pg_ctl" ] && [ -x "$bindir/postgres" ] && return 0
    done
    return 1
}
if [ -z "${DUETIME_DATABASE_URL:-}${DUETIME_SHARD_DSNS:-}" ] && ! have_pg_server; then
    say "the PostgreSQL server programs are missing, and 'duetime run' needs them for its embedded"
    say "database: apt-get install postgresql   (or set DUETIME_DATABASE_URL to a database you run)"
fi
