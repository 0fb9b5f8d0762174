"""Selective prefill (SPEC §2 step 5): each layer computes only its computed set C_l.

C_l = every text token, every token of a segment without reusable KV, and the tokens the policy
picks for each reused segment. Tokens outside C_l get no norm, projection, attention or MLP at
layer l; their K/V there come from the cache entry (pre-RoPE K rotated at the new positions).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from vlcache.models.adapter import QwenVLAdapter
from vlcache.reuse.kvcache import KVCache
from vlcache.reuse.policy import LayerProbe, TokenSchedule
from vlcache.reuse.rope import apply_rope


@dataclass
class SegmentInput:
    """One image's place in this prompt and what the prefill may reuse or must record for it."""

    start: int  # index of the first image token in the sequence
    length: int  # N
    cached_keys: torch.Tensor | None = None  # [L, N, kvh, d] pre-RoPE; None = compute all
    cached_values: torch.Tensor | None = None  # [L, N, kvh, d]
    schedule: TokenSchedule | None = None  # required when cached KV is given
    capture: bool = False  # record this segment's pre-RoPE KV (a miss)
    deepstack: torch.Tensor | None = None  # [D, N, H] Qwen3-VL visual features
    # The cached hidden state entering the schedule's `restart_layer` ([N, H], from the same run
    # as the KV): there the schedule may pick any token, not only those computed one layer
    # down; tokens not computed below resume from these rows.
    cached_hidden: torch.Tensor | None = None

    @property
    def reused(self) -> bool:
        return self.cached_keys is not None


@dataclass
class PrefillOutput:
    logits: torch.Tensor  # [V] at the last prompt token (float32)
    cache: KVCache
    computed_per_layer: list[int]  # |C_l| for each layer
    reused_computed: list[list[int]]  # per reused segment, tokens computed at each layer
    captured: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    # segment index -> (keys, values) [L, N, kvh, d] pre-RoPE, for segments with capture=True
    captured_hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    # segment index -> [N, H] hidden state entering layer `capture_hidden_at` (capture=True)
    final_hidden: torch.Tensor | None = None  # [S, H] last-layer output rows (valid on C_L)
    final_index: torch.Tensor | None = None  # [c_L] the rows of final_hidden that are valid


def attend(
    q: torch.Tensor,  # [c, nh, d] rotated queries of the computed tokens
    k: torch.Tensor,  # [S, kvh, d] rotated keys of the whole sequence
    v: torch.Tensor,  # [S, kvh, d]
    index: torch.Tensor | None,  # [c] sequence positions of the queries; None = all S, causal
    scale: float,
) -> torch.Tensor:  # [c, nh*d]
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))  # [1, heads, len, d]
    if index is None:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale,
                                             enable_gqa=True)
    else:
        mask = torch.arange(k.shape[0], device=k.device)[None, :] <= index[:, None]  # [c, S]
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale,
                                             enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def _resumes(seg: SegmentInput, layer: int) -> bool:
    """Whether this segment may start computing tokens afresh at `layer` from its cached hidden
    state: the schedule asks for it there and the entry holds that layer's input."""
    return seg.cached_hidden is not None and seg.schedule.restart_layer == layer


def _select(seg: SegmentInput, layer: int, previous: torch.Tensor, h: torch.Tensor,
            adapter: QwenVLAdapter) -> torch.Tensor:
    """The schedule's choice for one reused segment at one layer, checked to be nested (or, at
    a resume layer, any tokens: those not computed below take their cached hidden state)."""
    if _resumes(seg, layer):
        stale = ~torch.isin(torch.arange(seg.length, device=previous.device), previous)
        rows = stale.nonzero().squeeze(1)  # [n_stale] not computed below: resume from the cache
        h[seg.start + rows] = seg.cached_hidden[rows].to(h.dtype)
        previous = torch.arange(seg.length, device=previous.device)

    def deviation() -> torch.Tensor:  # [c_prev]
        _, k, _ = adapter.qkv(layer, h[seg.start + previous])
        cached = seg.cached_keys[layer, previous].to(k.dtype)
        return (k - cached).float().pow(2).sum(dim=(1, 2))

    chosen = seg.schedule.select(layer, LayerProbe(layer, previous, deviation))
    chosen = chosen.to(torch.long).sort().values
    if chosen.numel() and (chosen[-1] >= seg.length or not torch.isin(chosen, previous).all()):
        raise RuntimeError(
            f"policy chose tokens at layer {layer} that were not computed at layer {layer - 1}"
        )
    return chosen


def selective_prefill(
    adapter: QwenVLAdapter,
    embeds: torch.Tensor,  # [S, H] token embeddings with image embeddings in place
    positions: torch.Tensor,  # [3, S] M-RoPE positions
    segments: list[SegmentInput],
    capacity: int,  # KV cache capacity (prompt + tokens to decode)
    keep_hidden: bool = False,
    capture_hidden_at: int | None = None,  # also record capture segments' input to this layer
) -> PrefillOutput:
    seq_len = embeds.shape[0]
    device = embeds.device
    cos, sin = adapter.rope_tables(positions)  # [S, d]
    cache = KVCache(adapter.num_layers, adapter.kv_heads, adapter.head_dim, capacity,
                    adapter.dtype, device)
    reused = [s for s in segments if s.reused]
    always = torch.ones(seq_len, dtype=torch.bool, device=device)
    for s in reused:
        always[s.start:s.start + s.length] = False
    base = always.nonzero().squeeze(1)  # [b] tokens computed at every layer
    previous = {id(s): torch.arange(s.length, device=device) for s in reused}
    captured = {i: ([], []) for i, s in enumerate(segments) if s.capture}
    deepstack_rows = [s for s in segments if s.deepstack is not None]
    computed_per_layer: list[int] = []
    reused_computed: list[list[int]] = [[] for _ in reused]
    h = embeds.clone()
    index: torch.Tensor | None = None
    captured_hidden: dict[int, torch.Tensor] = {}
    for layer in range(adapter.num_layers):
        if layer == capture_hidden_at:
            for i in captured:
                s = segments[i]
                captured_hidden[i] = h[s.start:s.start + s.length].clone()  # [N, H]
        parts = [base]
        for j, s in enumerate(reused):
            chosen = _select(s, layer, previous[id(s)], h, adapter)
            previous[id(s)] = chosen
            reused_computed[j].append(int(chosen.numel()))
            parts.append(chosen + s.start)
        index = torch.cat(parts).sort().values if reused else None
        if index is not None and index.numel() == seq_len:
            index = None  # every token computed here: the plain causal path is exact and faster
        x = h if index is None else h[index]  # [c, H]
        q, k, v = adapter.qkv(layer, x)
        if index is None:
            keys, values = k, v  # [S, kvh, d] pre-RoPE
        else:
            keys = torch.empty(seq_len, adapter.kv_heads, adapter.head_dim, dtype=k.dtype,
                               device=device)
            values = torch.empty_like(keys)
            for s in reused:
                keys[s.start:s.start + s.length] = s.cached_keys[layer]
                values[s.start:s.start + s.length] = s.cached_values[layer]
            keys[index] = k
            values[index] = v
        for i, (ks, vs) in captured.items():
            s = segments[i]
            ks.append(keys[s.start:s.start + s.length].clone())
            vs.append(values[s.start:s.start + s.length].clone())
        keys = apply_rope(keys, cos, sin)
        q = apply_rope(q, cos if index is None else cos[index], sin if index is None else
                       sin[index])
        out = adapter.finish(layer, x, attend(q, keys, values, index, adapter.scaling))
        cache.write_prefill(layer, keys, values)
        if index is None:
            h = out
        else:
            h[index] = out
        for s in deepstack_rows:
            if layer < s.deepstack.shape[0]:
                _add_deepstack(h, s, layer, index)
        computed_per_layer.append(int(seq_len if index is None else index.numel()))
    cache.length = seq_len
    last = adapter.logits(h[seq_len - 1:seq_len])[0]
    return PrefillOutput(
        logits=last,
        cache=cache,
        computed_per_layer=computed_per_layer,
        reused_computed=reused_computed,
        captured={i: (torch.stack(ks), torch.stack(vs)) for i, (ks, vs) in captured.items()},
        captured_hidden=captured_hidden,
        final_hidden=h if keep_hidden else None,
        final_index=index if keep_hidden else None,
    )


def _add_deepstack(h: torch.Tensor, s: SegmentInput, layer: int,
                   index: torch.Tensor | None) -> None:
    """Qwen3-VL adds visual features to image tokens' outputs of the first D layers."""
    rows = torch.arange(s.start, s.start + s.length, device=h.device)
    feats = s.deepstack[layer]  # [N, H]
    if index is not None and s.reused:
        keep = torch.isin(rows, index)
        rows, feats = rows[keep], feats[keep]
    h[rows] += feats.to(h.dtype)
