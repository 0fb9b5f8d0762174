#!/usr/bin/env bash
# The test command: sets up the environment, installs redis-server for the store tests if it is
# missing, and runs the test suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if ! command -v redis-server >/dev/null 2>&1; then
  echo "== installing redis-server (the Redis store tests start their own server)"
  if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null \
    || echo "!! could not install redis-server; the Redis tests will be skipped"
fi
exec .venv/bin/python -m pytest -q "$@"
