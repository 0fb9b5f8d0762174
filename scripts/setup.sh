#!/usr/bin/env bash
# Creates .venv (if missing) and installs vlcache with its development extras, and the fixture
# (fixture/: the trained test model's own package and `vlcache-fixture` command), and the vLLM
# integration's core (integrations/vllm: vLLM itself is an extra, not installed here; its own
# environment comes from integrations/vllm/setup.sh).
# torch is pinned to 2.13.0: on this machine kind that is a local CPU wheel; an unpinned torch
# would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "== creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.vlcache-installed
# Reinstall when either pyproject changed, or a command is missing (a venv made before the
# fixture had its own package).
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ fixture/pyproject.toml -nt "$stamp" ] \
  || [ integrations/vllm/pyproject.toml -nt "$stamp" ] \
  || [ ! -x .venv/bin/vlcache ] || [ ! -x .venv/bin/vlcache-fixture ]; then
  echo "== installing vlcache, the fixture, the vLLM integration's core and their dependencies (first run takes a few minutes)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e '.[dev]' -e ./fixture -e ./integrations/vllm
  touch "$stamp"
fi
