"""Moved-image KV reuse inside vLLM (stage 2): a worker and a Qwen2.5-VL model class that
serve an image's cached pre-RoPE KV at new positions and compute only a policy's tokens.

`rows` and `entries` do not import vLLM; `model` and `worker` do.
"""
