#!/usr/bin/env bash
# The prepared GPU check: one device call of at most ~8 minutes, everything written to $OUT.
#   1. the CUDA exactness tests (tests/cuda) and the CPU-side layer-loop tests, on the GPU box;
#   2. the TTFT sweep on random-weight models of real sizes (timing does not depend on weight
#      values): Qwen2.5-VL-7B and Qwen3-VL-8B at 1K, 4K and 16K image tokens, cases full,
#      encoder, naive, static:0.05 and transformers' own generate(max_new_tokens=1), rounds
#      interleaved; TTFT ends when the first token is on the host, so the timers are synchronised.
# The device machine has torch 2.11 and transformers 5.17 and no network: the code runs from src/
# (PYTHONPATH), and blake3 travels as a wheel in .whl/ (see docs/bench/README.md, "GPU check").
#   run: bash benchmarks/gpu_check.sh        (on the device: OUT is set by the device tool)
#   smoke test on a CPU: DEVICE=cpu DTYPE=fp32 ARCHS=tiny-qwen2_5_vl TOKENS=64 bash benchmarks/gpu_check.sh
# The results come back as one archive, $OUT/gpu-check.tgz, plus $OUT/summary.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu-check}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:src
else
  export PYTHONPATH=src
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi; ${PY:-python3} -c "import torch, transformers; print('torch', torch.__version__,
  'transformers', transformers.__version__, torch.cuda.get_device_name(0))"; } \
  > "$OUT/machine.txt" 2>&1
timeout 120 ${PY:-python3} -m pytest -q -p no:cacheprovider tests/cuda tests/reuse/test_attention.py \
  tests/reuse/test_host_sync.py 2>&1 | tail -30 > "$OUT/tests.txt"
DEVICE=${DEVICE:-cuda} DTYPE=${DTYPE:-bf16}
PY=${PY:-python3}
sweep() {  # arch, tokens, seconds
  timeout "$3" $PY -m vlcache.cli bench ttft --arch "$1" --device "$DEVICE" --dtype "$DTYPE" \
    --tokens "$2" --policies full,encoder,naive,static:0.05 --repeat 3 --no-prefix-same \
    --out "$OUT/ttft-$1" > "$OUT/ttft-$1.log" 2>&1
  echo "ttft $1: exit $?" >> "$OUT/status.txt"
}
for arch in ${ARCHS:-qwen2_5_vl-7b qwen3_vl-8b}; do
  sweep "$arch" "${TOKENS:-1024,4096,16384}" 200
done
cat "$OUT/machine.txt" "$OUT/tests.txt" "$OUT/status.txt" "$OUT"/ttft-*.md > "$OUT/summary.txt" \
  2>/dev/null
tar czf /tmp/gpu-check.tgz -C "$OUT" . && find "$OUT" -mindepth 1 ! -name summary.txt -delete \
  && mv /tmp/gpu-check.tgz "$OUT/"
cat "$OUT/summary.txt"
