"""Causal attention for the computed rows of a layer, without a dense [rows x sequence] mask.

A hit computes only some rows: the text around its segments (contiguous runs) and the tokens a
policy picked inside each reused segment. A single boolean mask over all of them is
[rows x sequence]; for a long prompt after a cached image it sends attention down the slow path
and costs more memory than the whole miss. Instead the rows are attended block by block:

- a contiguous run that starts at position 0 is plain causal attention;
- a contiguous run that starts at position `a` is, on the CPU, unmasked attention over keys
  [0, a) merged (by log-sum-exp) with causal attention over its own keys; elsewhere, where
  a <= its length, causal attention over keys [0, a + n) with `a` zero query rows in front,
  whose outputs are dropped (exact; the wasted work is at most the a x a triangle);
- anything else (a short run far into the sequence, the rows picked inside a segment) is masked,
  in chunks of rows small enough that each mask stays a few megabytes.

In fp32 on the CPU, where vlcache's kernels are built (`vlcache.kernels`), every block is one
call of its attention kernel instead, which takes the rows' positions and needs no mask: 1.7x
faster than PyTorch's flash attention at 284 rows, 1.36x at 1,052, 1.12x at 4,124, 1.1-1.2x
behind a cached prefix (`benchmarks/cpu_kernels.py`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlcache.kernels import cpu_kernels, usable

MASK_ELEMENTS = 1 << 22  # per masked chunk: rows x keys (4M booleans, 16 MB as float)
aten = torch.ops.aten  # (a seam for the tests' spies)
MERGED_DEVICES = {"cpu"}  # where late runs merge two attentions by log-sum-exp (CPU flash op)
KERNELS = True  # vlcache's CPU kernel where it applies (fp32 on the CPU, built); False: PyTorch's
BLOCK_Q, BLOCK_K = 32, 256  # the kernel's query rows (per KV head) and keys per step
_NO_POSITIONS = torch.empty(0, dtype=torch.long)


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
    if KERNELS and usable(q, k, v) and q.stride(-1) == k.stride(-1) == v.stride(-1) == 1:
        return _kernel_blocks(q, k, v, blocks, scale).reshape(q.shape[0], -1)
    if len(blocks) == 1 and blocks[0].positions is None and blocks[0].first == 0:
        return _causal(q, k, v, scale).reshape(q.shape[0], -1)
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])  # [c, nh, d]
    for b in blocks:
        qb = q[b.row:b.row + b.count]
        if b.positions is None and b.first == 0:
            out[b.row:b.row + b.count] = _causal(qb, k[:b.key_end], v[:b.key_end], scale)
        elif b.positions is None and q.device.type in MERGED_DEVICES:
            out[b.row:b.row + b.count] = _late_merged(qb, k[:b.key_end], v[:b.key_end],
                                                      b.first, scale)
        elif b.positions is None and b.first <= b.count:
            out[b.row:b.row + b.count] = _late_padded(qb, k[:b.key_end], v[:b.key_end],
                                                      b.first, scale)
        else:
            positions = b.positions if b.positions is not None else torch.arange(
                b.first, b.key_end, device=q.device)
            out[b.row:b.row + b.count] = _masked(qb, k[:b.key_end], v[:b.key_end], positions,
                                                 scale)
    return out.reshape(q.shape[0], -1)


def _kernel_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: list[RowBlock],
                   scale: float) -> torch.Tensor:  # [c, nh, d]
    """Each block by vlcache's CPU kernel (rows at their positions over keys [0, key_end))."""
    kernel = cpu_kernels().attention  # type: ignore[union-attr]

    def one(b: RowBlock) -> torch.Tensor:
        positions = (_NO_POSITIONS if b.positions is None
                     else b.positions.to(torch.long).contiguous())
        return kernel(q[b.row:b.row + b.count], k, v, positions, b.first, b.key_end, scale,
                      BLOCK_Q, BLOCK_K)

    if len(blocks) == 1:
        return one(blocks[0])
    out = q.new_empty(q.shape[0], q.shape[1], v.shape[2])
    for b in blocks:
        out[b.row:b.row + b.count] = one(b)
    return out


def _heads_first(t: torch.Tensor) -> torch.Tensor:  # [len, heads, d] -> [1, heads, len, d]
    return t.transpose(0, 1)[None]


def _causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Rows 0..n-1 at positions 0..n-1 over keys 0..n-1: [n, nh, d]."""
    out = F.scaled_dot_product_attention(_heads_first(q), _heads_first(k), _heads_first(v),
                                         is_causal=True, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def _late_padded(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int,
                 scale: float) -> torch.Tensor:
    """Rows at positions first..first+n-1 over keys 0..first+n-1 ([n, nh, d]): causal
    attention with `first` zero query rows in front, their outputs dropped."""
    padded = torch.cat([q.new_zeros(first, *q.shape[1:]), q])  # [first+n, nh, d]
    return _causal(padded, k, v, scale)[first:]


def _late_merged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, first: int,
                 scale: float) -> torch.Tensor:
    """The same rows as `_late_padded`, without its wasted triangle (CPU): unmasked
    attention over keys [0, first) and causal attention over the run's own keys, each with its
    log-sum-exp, merged as one softmax over both."""
    flash = aten._scaled_dot_product_flash_attention_for_cpu
    qh, kh, vh = _heads_first(q), _heads_first(k), _heads_first(v)
    own, own_lse = flash(qh, kh[:, :, first:], vh[:, :, first:], 0.0, True, scale=scale)[:2]
    if first == 0:
        return own[0].transpose(0, 1)
    pre, pre_lse = flash(qh, kh[:, :, :first], vh[:, :, :first], 0.0, False, scale=scale)[:2]
    # each part is normalised over its own keys; own's share of the joint softmax is
    # e^own / (e^own + e^pre) = sigmoid(own_lse - pre_lse)
    share = torch.sigmoid(own_lse - pre_lse)  # [1, nh, n], fp32 whatever q's dtype
    # merged in fp32 (a no-op there): bf16/fp16 parts would lose the weights' precision
    merged = torch.lerp(pre.float(), own.float(), share[..., None])  # [1, nh, n, d]
    return merged[0].transpose(0, 1).to(q.dtype)  # [n, nh, d]


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
