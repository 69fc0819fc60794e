#!/usr/bin/env bash
# The whole test suite, from anywhere: sets up .venv when needed, makes sure PostgreSQL, Redis and
# NATS answer (starting them when they do not), then runs pytest on DUETIME_TEST_WORKERS workers
# (pytest-xdist; default 3: most tests wait on timers, processes and the services, not the CPU).
# tests/conftest.py deals the suite out by module, the cluster cases one after the other (README,
# "Test it"). Extra arguments go to pytest: `./scripts/test.sh tests/pure`, or `-n 0` for one
# process.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/services.sh
exec .venv/bin/pytest -q -n "${DUETIME_TEST_WORKERS:-3}" "$@"
