#!/usr/bin/env bash
# A vLLM environment for the connector: vLLM's CPU build 0.32.0 with the fixes in
# benchmarks/peer/setup_vllm_env.sh (torchaudio/torchcodec removed, torchvision's fake-kernel
# registrations made conditional), then vlcache and vlcache-vllm installed into it, editable and
# without their dependencies (vLLM's environment already has what they need, and its pins win).
#
#   integrations/vllm/setup.sh [VENV]      # default: .venv-vllm at the repository root
#   VLCACHE_VLLM_PYTHON=.venv-vllm/bin/python .venv/bin/python -m pytest -m slow integrations/vllm
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.venv-vllm}
benchmarks/peer/setup_vllm_env.sh "$VENV"
"$VENV/bin/pip" install -q --no-deps -e . -e integrations/vllm
"$VENV/bin/python" -c "import vlcache_vllm.connector, vllm; print('vlcache-vllm ok, vllm', vllm.__version__)"
