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


def forced_logits(adapter: QwenVLAdapter, caches: list[KVCache], tokens: list[int],
                  position: int) -> torch.Tensor:  # [A, t, V] float32
    """Logits after each of `tokens`, fed at `position`, `position + 1`, ... (text positions, the
    same on all M-RoPE axes) after each of A prompts of one length, appended to its cache:
    `decode_step` for t tokens at once, for A caches at once."""
    t, arms = len(tokens), len(caches)
    past = caches[0].length
    if any(c.length != past for c in caches):
        raise ValueError("the caches hold prompts of different lengths")
    device = adapter.device
    h = adapter.embed(torch.tensor(tokens)).repeat(arms, 1)  # [A*t, H]
    pos = torch.arange(position, position + t, device=device).expand(3, t)  # [3, t]
    cos, sin = (x.repeat(arms, 1) for x in adapter.rope_tables(pos))  # [A*t, d]
    # new token i sees the whole prompt and new tokens 0..i
    mask = torch.ones(t, past + t, dtype=torch.bool, device=device)  # [t, T + t]
    mask[:, past:] = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    for layer in range(adapter.num_layers):
        q, k, v = adapter.qkv(layer, h)  # [A*t, nh, d], [A*t, kvh, d], [A*t, kvh, d]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = torch.empty(arms * t, q.shape[1] * q.shape[2], dtype=h.dtype, device=device)
        for a, cache in enumerate(caches):
            rows = slice(a * t, (a + 1) * t)
            keys, values = cache.append(layer, k[rows], v[rows])  # [kvh, T + t, d]
            qh = q[rows].transpose(0, 1)[None]  # [1, nh, t, d]
            att = torch.nn.functional.scaled_dot_product_attention(
                qh, keys[None], values[None], attn_mask=mask, scale=adapter.scaling,
                enable_gqa=True)  # [1, nh, t, d]
            out[rows] = att[0].transpose(0, 1).reshape(t, -1)
        h = adapter.finish(layer, h, out)
    for cache in caches:
        cache.length += t
    return adapter.logits(h).view(arms, t, -1)
