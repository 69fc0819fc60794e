#!/usr/bin/env bash
# The whole test suite, from anywhere: sets up .venv when needed, makes sure PostgreSQL, Redis and
# NATS answer (starting them when they do not), then runs pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/services.sh
exec .venv/bin/pytest -q "$@"
