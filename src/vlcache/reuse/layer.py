"""One decoder layer over the computed rows of a prompt, the rest of the keys taken from caches.

Shared by the selective prefill and the relevance pass: the rows a layer computes get norm,
Q/K/V projections, attention over every key of the sequence and the MLP; the keys and values of
rows it does not compute come from the reused segments' cache entries (pre-RoPE K, rotated here
at the prompt's positions).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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

    @property
    def span(self) -> tuple[int, int] | None:
        """(first, end) when the rows are one contiguous run of positions (from the blocks'
        host-side bounds, no tensor read): slices then stand in for gathers and scatters."""
        if not self.blocks or any(b.positions is not None for b in self.blocks):
            return None
        for a, b in zip(self.blocks, self.blocks[1:], strict=False):
            if b.first != a.first + a.count:
                return None
        first = self.blocks[0].first
        return first, first + sum(b.count for b in self.blocks)

    @cached_property
    def pick(self) -> slice | torch.Tensor:
        """What selects the rows from a [S, ...] tensor: a slice for all rows or one contiguous
        run (views, no gather or scatter), else `index`. Worked out once per layer."""
        if self.index is None:
            return slice(None)
        run = self.span
        return slice(*run) if run else self.index

    @property
    def last_position(self) -> int:
        """The sequence position of the last computed row."""
        b = self.blocks[-1]
        return b.first + b.count - 1 if b.positions is None else int(b.positions[-1])


@dataclass(frozen=True)
class CachedSpan:
    """A reused segment's cached KV at one layer: rows [start, start + N)."""

    start: int
    keys: torch.Tensor  # [N, kvh, d] pre-RoPE
    values: torch.Tensor  # [N, kvh, d]


@dataclass
class LayerOut:
    hidden: torch.Tensor  # [c, H] the computed rows' outputs ([1, H] with `last_only`)
    keys: torch.Tensor  # [S, kvh, d] pre-RoPE, fresh on computed rows, cached elsewhere
    values: torch.Tensor  # [S, kvh, d]
    rotated: torch.Tensor  # [S, kvh, d] keys after RoPE
    queries: torch.Tensor  # [c, nh, d] after RoPE ([1, nh, d] with `last_only`)


def layer_step(adapter: QwenVLAdapter, layer: int,
               h: torch.Tensor,  # [S, H] hidden states entering the layer (valid on the rows)
               rows: Rows, cached: list[CachedSpan],
               cos: torch.Tensor, sin: torch.Tensor,  # [S, d] rotary tables of the prompt
               last_only: bool = False,
               ) -> LayerOut:
    """`last_only`: every computed row gets its keys and values, but only the sequence's last
    row (which must be computed) its attention, output projection and MLP: at a prompt's last
    layer nothing else reads the other rows' outputs."""
    index, pick = rows.index, rows.pick
    x = h[pick]  # [c, H]
    q, k, v = adapter.qkv(layer, x)
    blocks, q_rows = rows.blocks, pick
    if last_only:
        last = h.shape[0] - 1
        if rows.last_position != last:
            raise ValueError("last_only needs the sequence's last row among the computed rows")
        x, q = x[-1:], q[-1:]  # [1, H], [1, nh, d]
        blocks, q_rows = [RowBlock.run(0, last, 1)], slice(last, last + 1)
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
        keys[pick] = k
        values[pick] = v
    rotated = apply_rope(keys, cos, sin)
    q = apply_rope(q, cos[q_rows], sin[q_rows])
    out = adapter.finish(layer, x, attend_blocks(q, rotated, values, blocks, adapter.scaling))
    return LayerOut(out, keys, values, rotated, q)
