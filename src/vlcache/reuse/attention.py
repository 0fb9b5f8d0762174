"""Causal attention for the computed rows of a layer, without a dense [rows x sequence] mask.

A hit computes only some rows: the text around its segments (contiguous runs) and the tokens a
policy picked inside each reused segment. A single boolean mask over all of them is
[rows x sequence]; for a long prompt after a cached image it sends attention down the slow path
and costs more memory than the whole miss. Instead the rows are attended block by block:

- a contiguous run that starts at position 0 is plain causal attention;
- a contiguous run that starts at position `a` (a <= its length) is causal attention over keys
  [0, a + n) with `a` zero query rows in front, whose outputs are dropped: exact, and the wasted
  work is at most the a x a triangle;
- anything else (a short run far into the sequence, the rows picked inside a segment) is masked,
  in chunks of rows small enough that each mask stays a few megabytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

MASK_ELEMENTS = 1 << 22  # per masked chunk: rows x keys (4M booleans, 16 MB as float)


@dataclass(frozen=True)
class RowBlock:
    """Query rows [row, row + count) of the computed set.

    `positions` None: a contiguous run at sequence positions first .. first + count - 1.
    Otherwise the rows' sorted sequence positions, all below `key_end` (a host-side bound, so
    the block's shape never depends on tensor values).
    """

    row: int
    count: int
    first: int
    key_end: int
    positions: torch.Tensor | None = None  # [count] int64

    @classmethod
    def run(cls, row: int, first: int, count: int) -> RowBlock:
        return cls(row, count, first, first + count)


def attend_blocks(
    q: torch.Tensor,  # [c, nh, d] rotated queries of the computed rows
    k: torch.Tensor,  # [S, kvh, d] rotated keys of the whole sequence
    v: torch.Tensor,  # [S, kvh, d]
    blocks: list[RowBlock],  # cover rows 0..c-1 in order
    scale: float,
) -> torch.Tensor:  # [c, nh*d]
    if len(blocks) == 1 and blocks[0].positions is None and blocks[0].first == 0:
        return _causal(q, k, v, scale).reshape(q.shape[0], -1)
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])  # [c, nh, d]
    for b in blocks:
        qb = q[b.row:b.row + b.count]
        if b.positions is None and b.first == 0:
            out[b.row:b.row + b.count] = _causal(qb, k[:b.key_end], v[:b.key_end], scale)
        elif b.positions is None and b.first <= b.count:
            padded = torch.cat([qb.new_zeros(b.first, *qb.shape[1:]), qb])  # [first+n, nh, d]
            full = _causal(padded, k[:b.key_end], v[:b.key_end], scale)
            out[b.row:b.row + b.count] = full[b.first:]
        else:
            positions = b.positions if b.positions is not None else torch.arange(
                b.first, b.key_end, device=q.device)
            out[b.row:b.row + b.count] = _masked(qb, k[:b.key_end], v[:b.key_end], positions,
                                                 scale)
    return out.reshape(q.shape[0], -1)


def _heads_first(t: torch.Tensor) -> torch.Tensor:  # [len, heads, d] -> [1, heads, len, d]
    return t.transpose(0, 1)[None]


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows 0..n-1 at positions 0..n-1 over keys 0..n-1: [n, nh, d]."""
    out = F.scaled_dot_product_attention(_heads_first(q), _heads_first(k), _heads_first(v),
                                         is_causal=True, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
            scale: float) -> torch.Tensor:  # [n, nh, d]
    keys = torch.arange(k.shape[0], device=k.device)  # [K]
    kh, vh = _heads_first(k), _heads_first(v)
    step = max(1, MASK_ELEMENTS // max(k.shape[0], 1))
    parts = []
    for r in range(0, q.shape[0], step):
        mask = keys[None, :] <= positions[r:r + step, None]  # [rows, K]
        out = F.scaled_dot_product_attention(_heads_first(q[r:r + step]), kh, vh,
                                             attn_mask=mask, scale=scale, enable_gqa=True)
        parts.append(out[0].transpose(0, 1))
    return parts[0] if len(parts) == 1 else torch.cat(parts)
