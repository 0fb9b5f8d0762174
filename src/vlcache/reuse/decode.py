"""One decoding step over the request's KV cache (plain autoregressive attention)."""

from __future__ import annotations

import torch

from vlcache.models.adapter import QwenVLAdapter
from vlcache.reuse.kvcache import KVCache
from vlcache.reuse.rope import apply_rope


def decode_step(
    adapter: QwenVLAdapter,
    cache: KVCache,
    token_id: int,
    position: int,  # text position of the new token (same value on all three M-RoPE axes)
) -> torch.Tensor:  # [V] float32 logits
    h = adapter.embed(torch.tensor([token_id]))  # [1, H]
    pos = torch.full((3, 1), position, dtype=torch.long)
    cos, sin = adapter.rope_tables(pos)  # [1, d]
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, h)
        k = apply_rope(k, cos, sin)
        q = apply_rope(q, cos, sin)
        keys, values = cache.append(layer, k, v)  # [kvh, T, d]
        # the new token sees everything before it: no mask needed
        out = _attend_all(q, keys, values, adapter.scaling)
        h = adapter.finish(layer, h, out)
    cache.length += 1
    return adapter.logits(h)[0]


def _attend_all(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                scale: float) -> torch.Tensor:  # q [1, nh, d], keys/values [kvh, T, d]
    qh = q.transpose(0, 1)[None]  # [1, nh, 1, d]
    out = torch.nn.functional.scaled_dot_product_attention(
        qh, keys[None], values[None], scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1).reshape(1, -1)
