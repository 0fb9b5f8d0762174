"""One decoder layer over the computed rows of a prompt, the rest of the keys taken from caches.

Shared by the selective prefill and the relevance pass: the rows a layer computes get norm,
Q/K/V projections, attention over every key of the sequence and the MLP; the keys and values of
rows it does not compute come from the reused segments' cache entries (pre-RoPE K, rotated here
at the prompt's positions).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlcache.models.adapter import QwenVLAdapter
from vlcache.reuse.attention import RowBlock, attend_blocks
from vlcache.reuse.rope import apply_rope


@dataclass(frozen=True)
class Rows:
    """The rows a layer computes: `index` [c] sequence positions in order (None: all S) and
    their attention blocks."""

    index: torch.Tensor | None
    blocks: list[RowBlock]

    @classmethod
    def all(cls, seq_len: int) -> Rows:
        return cls(None, [RowBlock.run(0, 0, seq_len)])

    def count(self, seq_len: int) -> int:
        return seq_len if self.index is None else int(self.index.numel())


@dataclass(frozen=True)
class CachedSpan:
    """A reused segment's cached KV at one layer: rows [start, start + N)."""

    start: int
    keys: torch.Tensor  # [N, kvh, d] pre-RoPE
    values: torch.Tensor  # [N, kvh, d]


@dataclass
class LayerOut:
    hidden: torch.Tensor  # [c, H] the computed rows' outputs
    keys: torch.Tensor  # [S, kvh, d] pre-RoPE, fresh on computed rows, cached elsewhere
    values: torch.Tensor  # [S, kvh, d]
    rotated: torch.Tensor  # [S, kvh, d] keys after RoPE
    queries: torch.Tensor  # [c, nh, d] after RoPE


def layer_step(adapter: QwenVLAdapter, layer: int,
               h: torch.Tensor,  # [S, H] hidden states entering the layer (valid on the rows)
               rows: Rows, cached: list[CachedSpan],
               cos: torch.Tensor, sin: torch.Tensor,  # [S, d] rotary tables of the prompt
               ) -> LayerOut:
    index = rows.index
    x = h if index is None else h[index]  # [c, H]
    q, k, v = adapter.qkv(layer, x)
    if index is None:
        keys, values = k, v
    else:
        keys = torch.empty(h.shape[0], adapter.kv_heads, adapter.head_dim, dtype=k.dtype,
                           device=h.device)
        values = torch.empty_like(keys)
        for span in cached:
            n = span.keys.shape[0]
            keys[span.start:span.start + n] = span.keys
            values[span.start:span.start + n] = span.values
        keys[index] = k
        values[index] = v
    rotated = apply_rope(keys, cos, sin)
    q = apply_rope(q, cos if index is None else cos[index], sin if index is None else sin[index])
    out = adapter.finish(layer, x, attend_blocks(q, rotated, values, rows.blocks,
                                                 adapter.scaling))
    return LayerOut(out, keys, values, rotated, q)
