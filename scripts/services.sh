#!/usr/bin/env bash
# Make sure the services the test suite uses answer on 127.0.0.1: PostgreSQL (5432), Redis (6379)
# and NATS with JetStream (4222). A service that does not answer is started with this machine's
# own server; a server that is not installed is named with the package to install.
# Idempotent: services that already answer are left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "services: $*" >&2; }
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
await_port() {
    local port=$1 name=$2
    for _ in $(seq 1 150); do
        answers "$port" && return 0
        sleep 0.2
    done
    say "$name was started but does not answer on 127.0.0.1:$port"
    return 1
}
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        "$@"
    fi
}
failed=0

# --- PostgreSQL -----------------------------------------------------------------------------------
if ! answers 5432; then
    version="$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1 || true)"
    if command -v pg_ctlcluster >/dev/null 2>&1 && [ -n "$version" ]; then
        say "starting PostgreSQL $version"
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start
        await_port 5432 PostgreSQL || failed=1
    else
        say "PostgreSQL is not running and not installed: apt-get install postgresql"
        failed=1
    fi
fi

# --- Redis ----------------------------------------------------------------------------------------
if ! answers 6379; then
    if command -v redis-server >/dev/null 2>&1; then
        say "starting Redis"
        as_root mkdir -p /var/lib/redis /var/log/redis
        as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" \
            --appendonly no --dir /var/lib/redis --logfile /var/log/redis/ci.log
        await_port 6379 Redis || failed=1
    else
        say "Redis is not running and not installed: apt-get install redis-server"
        failed=1
    fi
fi

# --- NATS (JetStream) -----------------------------------------------------------------------------
if ! answers 4222; then
    nats="$(command -v nats-server 2>/dev/null || echo /usr/sbin/nats-server)"
    if [ -x "$nats" ]; then
        say "starting NATS with JetStream"
        as_root mkdir -p /var/lib/nats-server
        if command -v start-stop-daemon >/dev/null 2>&1; then
            as_root start-stop-daemon --start --oknodo --background --exec "$nats" -- \
                -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
        else
            as_root setsid "$nats" -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server \
                -l /var/log/nats-server.log </dev/null >/dev/null 2>&1 &
        fi
        await_port 4222 NATS || failed=1
    else
        say "NATS is not running and not installed: apt-get install nats-server"
        failed=1
    fi
fi

# --- libfaketime (the clock-skew fault tests) -----------------------------------------------------
# Not a service: a library the fault suite preloads into a Duetime process to run its clock ahead
# of the database's. Installed here when root may (Debian: apt-get install faketime).
if ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        say "installing libfaketime (apt-get install faketime) for the clock-skew tests"
        { apt-get install -y -q faketime || { apt-get update -q && apt-get install -y -q faketime; }; } \
            >/dev/null 2>&1 || say "could not install faketime; the clock-skew tests will fail"
    else
        say "libfaketime is missing and cannot be installed here: apt-get install faketime"
    fi
fi

if [ "$failed" -ne 0 ]; then
    exit 1
fi

# --- the test suite's PostgreSQL account ----------------------------------------------------------
# The suite creates (and drops) its own databases as DUETIME_TEST_PG's user. Say so plainly when
# that user may not, instead of failing every database test with the same error.
if [ -x .venv/bin/python ]; then
    if ! problem="$(.venv/bin/python - <<'PY' 2>&1
import asyncio
import os

import asyncpg

dsn = os.environ.get("DUETIME_TEST_PG", "postgresql://root@127.0.0.1:5432/postgres")


async def check() -> None:
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        if not await conn.fetchval("SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"):
            raise SystemExit(f"{dsn}: this role may not create databases")
    finally:
        await conn.close()


try:
    asyncio.run(check())
except (OSError, asyncpg.PostgresError) as exc:
    raise SystemExit(f"{dsn}: {exc}") from None
PY
)"; then
        say "PostgreSQL answers, but the test suite cannot use it: $problem"
        say "give it a role that may create databases and trust local TCP logins, e.g.:"
        say "  runuser -u postgres -- createuser --superuser \"$(id -un)\""
        say "  and in /etc/postgresql/*/main/pg_hba.conf: host all all 127.0.0.1/32 trust (then reload)"
        say "or set DUETIME_TEST_PG to a server where it may create databases"
        exit 1
    fi
fi
