"""Selective prefill (design §2 step 5): each layer computes only its computed set C_l.

C_l = every text token, every token of a segment without reusable KV, and the tokens the policy
picks for each reused segment. Tokens outside C_l get no norm, projection, attention or MLP at
layer l; their K/V there come from the cache entry (pre-RoPE K rotated at the new positions).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from vlcache.models.adapter import QwenVLAdapter
from vlcache.reuse.attention import RowBlock
from vlcache.reuse.kvcache import KVCache
from vlcache.reuse.layer import CachedSpan, Rows, layer_step
from vlcache.reuse.policy import LayerProbe, TokenSchedule
from vlcache.reuse.relevance import relevance


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
    # For schedules that rank by relevance: the attention the prompt's question gives each of
    # this segment's tokens ([N], from the relevance pass); set by the prefill when asked.
    relevance: torch.Tensor | None = None
    # For analysis only (the oracle rule): this segment's exact pre-RoPE KV in this prompt,
    # from a full run ([L, N, kvh, d] each).
    reference_keys: torch.Tensor | None = None
    reference_values: torch.Tensor | None = None
    reference_error: torch.Tensor | None = None  # [N], derived from the two above
    # Reused behind a prefix identical to the one its KV was computed behind: exact, nothing
    # recomputed whatever the policy.
    exact: bool = False

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
    relevance_s: float = 0.0  # time spent in the relevance pass (query-ranked schedules)
    captured_rows: tuple[torch.Tensor, torch.Tensor] | None = None  # [L, b-a, kvh, d] each
    naive_logits: torch.Tensor | None = None  # [V] the relevance pass's, when it ran all layers
    relevance: dict[int, torch.Tensor] = field(default_factory=dict)
    # segment index -> [N] the question's attention to its tokens (when the relevance pass ran)


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

    probe = LayerProbe(layer, previous, deviation, relevance=seg.relevance,
                       reference=_reference_error(seg))
    chosen = seg.schedule.select(layer, probe).to(torch.long)
    if seg.schedule.nested and not _resumes(seg, layer):
        return chosen  # a sorted subset of `previous` by construction: nothing to check
    chosen = chosen.sort().values
    if chosen.numel() and (chosen[-1] >= seg.length or not torch.isin(chosen, previous).all()):
        raise RuntimeError(
            f"policy chose tokens at layer {layer} that were not computed at layer {layer - 1}"
        )
    return chosen


def _reference_error(seg: SegmentInput) -> torch.Tensor | None:
    """[N] how far each cached token is from the full run, over all layers: per layer the
    squared error of K and of V relative to their mean squared norm, summed (None: no full run
    given). Computed once per segment and kept."""
    if seg.reference_keys is None or seg.reference_values is None:
        return None
    if seg.reference_error is None:
        total = torch.zeros(seg.length, dtype=torch.float32, device=seg.cached_keys.device)
        for cached, exact in ((seg.cached_keys, seg.reference_keys),
                              (seg.cached_values, seg.reference_values)):
            diff = (cached.float() - exact.float()).pow(2).sum(dim=(2, 3))  # [L, N]
            scale = exact.float().pow(2).sum(dim=(2, 3)).mean(dim=1, keepdim=True)  # [L, 1]
            total += (diff / scale.clamp_min(1e-12)).sum(dim=0)
        seg.reference_error = total
    return seg.reference_error


def selective_prefill(
    adapter: QwenVLAdapter,
    embeds: torch.Tensor,  # [S, H] token embeddings with image embeddings in place
    positions: torch.Tensor,  # [3, S] M-RoPE positions
    segments: list[SegmentInput],
    capacity: int,  # KV cache capacity (prompt + tokens to decode)
    keep_hidden: bool = False,
    capture_hidden_at: int | None = None,  # also record capture segments' input to this layer
    probe_rows: torch.Tensor | None = None,  # [P] the question's rows, for query ranking
    prefix: tuple[torch.Tensor, torch.Tensor] | None = None,  # exact KV of rows [0, P)
    capture_rows: tuple[int, int] | None = None,  # also record pre-RoPE KV of rows [a, b)
) -> PrefillOutput:
    """`prefix`: the pre-RoPE K and V ([L, P, kvh, d]) of the prompt's first P rows, cached
    behind the very same tokens (a prefix-cache hit): exact, those rows are never computed.
    `segments` must lie after it."""
    seq_len = embeds.shape[0]
    device = embeds.device
    cos, sin = adapter.rope_tables(positions)  # [S, d]
    cache = KVCache(adapter.num_layers, adapter.kv_heads, adapter.head_dim, capacity,
                    adapter.dtype, device)
    span = _prefix_span(prefix, adapter.num_layers)
    reused = sorted((s for s in [*span, *segments] if s.reused), key=lambda s: s.start)
    runs = _runs_between(reused, seq_len)  # [(start, stop)] computed at every layer
    relevance_s, naive_logits = _rank_by_relevance(adapter, embeds, cos, sin, runs, reused,
                                                   probe_rows)
    previous = {id(s): torch.arange(s.length, device=device) for s in reused}
    captured = {i: ([], []) for i, s in enumerate(segments) if s.capture}
    deepstack_rows = [s for s in segments if s.deepstack is not None]
    computed_per_layer: list[int] = []
    reused_computed: list[list[int]] = [[] for _ in reused]
    rows_kv: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    h = embeds.clone()
    index: torch.Tensor | None = None
    captured_hidden: dict[int, torch.Tensor] = {}
    for layer in range(adapter.num_layers):
        if layer == capture_hidden_at:
            for i in captured:
                s = segments[i]
                captured_hidden[i] = h[s.start:s.start + s.length].clone()  # [N, H]
        chosen = []
        for j, s in enumerate(reused):
            chosen.append(_select(s, layer, previous[id(s)], h, adapter))
            previous[id(s)] = chosen[-1]
            reused_computed[j].append(int(chosen[-1].numel()))
        index, blocks = _computed_rows(runs, reused, chosen, seq_len, device)
        rows = Rows(index, blocks)
        spans = [CachedSpan(s.start, s.cached_keys[layer], s.cached_values[layer])
                 for s in reused]
        # past the last layer only the last row's output is read (its logits), unless the
        # caller keeps the hidden states: the other rows need their K/V there, nothing more
        last_only = layer == adapter.num_layers - 1 and not keep_hidden
        step = layer_step(adapter, layer, h, rows, spans, cos, sin, last_only)
        for i, (ks, vs) in captured.items():
            s = segments[i]
            ks.append(step.keys[s.start:s.start + s.length].clone())
            vs.append(step.values[s.start:s.start + s.length].clone())
        if capture_rows is not None:
            rows_kv[0].append(step.keys[capture_rows[0]:capture_rows[1]].clone())
            rows_kv[1].append(step.values[capture_rows[0]:capture_rows[1]].clone())
        cache.write_prefill(layer, step.rotated, step.values)
        if last_only:
            h[-1:] = step.hidden
        elif index is None:
            h = step.hidden
        else:
            h[rows.pick] = step.hidden
        for s in deepstack_rows:
            if layer < s.deepstack.shape[0]:
                _add_deepstack(h, s, layer, previous[id(s)] if s.reused else None)
        computed_per_layer.append(int(seq_len if index is None else index.numel()))
    cache.length = seq_len
    last = adapter.logits(h[seq_len - 1:seq_len])[0]
    return PrefillOutput(
        logits=last,
        cache=cache,
        computed_per_layer=computed_per_layer,
        reused_computed=[c for s, c in zip(reused, reused_computed, strict=True)
                         if not any(s is t for t in span)],
        captured={i: (torch.stack(ks), torch.stack(vs)) for i, (ks, vs) in captured.items()},
        captured_rows=(torch.stack(rows_kv[0]), torch.stack(rows_kv[1]))
        if capture_rows is not None else None,
        captured_hidden=captured_hidden,
        final_hidden=h if keep_hidden else None,
        final_index=index if keep_hidden else None,
        relevance_s=relevance_s,
        naive_logits=naive_logits,
        relevance={i: s.relevance for i, s in enumerate(segments) if s.relevance is not None},
    )


class _Nothing(TokenSchedule):
    """Recompute no token at any layer (an exact prefix)."""

    nested = True

    def select(self, layer: int, probe: LayerProbe) -> torch.Tensor:
        return probe.previous[:0]


def _prefix_span(prefix: tuple[torch.Tensor, torch.Tensor] | None,
                 num_layers: int) -> list[SegmentInput]:
    if prefix is None or prefix[0].shape[1] == 0:
        return []
    keys, values = prefix
    return [SegmentInput(0, keys.shape[1], cached_keys=keys, cached_values=values,
                         schedule=_Nothing(), exact=True)]


def _rank_by_relevance(adapter: QwenVLAdapter, embeds: torch.Tensor, cos: torch.Tensor,
                       sin: torch.Tensor, runs: list[tuple[int, int]],
                       reused: list[SegmentInput], probe_rows: torch.Tensor | None
                       ) -> tuple[float, torch.Tensor | None]:
    """Run the relevance pass if a schedule asks for it; set each segment's `relevance`.
    -> (its time, naive's last-token logits [V] when it ran every layer)."""
    depth = max((s.schedule.relevance_depth for s in reused), default=0)
    if not depth:
        return 0.0, None
    start = time.perf_counter()
    seq_len = embeds.shape[0]
    nothing = [torch.empty(0, dtype=torch.long, device=embeds.device) for _ in reused]
    rows = Rows(*_computed_rows(runs, reused, nothing, seq_len, embeds.device))
    if probe_rows is None or not probe_rows.numel():
        probe_rows = torch.tensor([seq_len - 1], device=embeds.device)
    spans = [(s.start, s.cached_keys, s.cached_values) for s in reused]
    mass, last = relevance(adapter, embeds, cos, sin, rows, spans, probe_rows, depth)  # [S], [H]
    for s in reused:
        s.relevance = mass[s.start:s.start + s.length]
    naive = adapter.logits(last[None])[0] if depth == adapter.num_layers else None
    return time.perf_counter() - start, naive


def _runs_between(reused: list[SegmentInput], seq_len: int) -> list[tuple[int, int]]:
    """The spans outside the reused segments (text, missed images), in order; empty spans kept
    so that run i precedes reused segment i."""
    bounds = [0] + [b for s in reused for b in (s.start, s.start + s.length)] + [seq_len]
    return list(zip(bounds[0::2], bounds[1::2], strict=True))


def _computed_rows(runs: list[tuple[int, int]], reused: list[SegmentInput],
                   chosen: list[torch.Tensor], seq_len: int, device: torch.device
                   ) -> tuple[torch.Tensor | None, list[RowBlock]]:
    """This layer's computed rows in position order ([c] indices; None = all S) and their
    attention blocks; block shapes come from host-side bounds, never from tensor values."""
    if not reused:
        return None, [RowBlock.run(0, 0, seq_len)]
    parts: list[torch.Tensor] = []
    blocks: list[RowBlock] = []
    row = 0
    for i, (a, b) in enumerate(runs):
        if b > a:
            parts.append(torch.arange(a, b, device=device))
            blocks.append(RowBlock.run(row, a, b - a))
            row += b - a
        if i < len(reused) and chosen[i].numel():
            s = reused[i]
            positions = chosen[i] + s.start  # [k] sorted
            parts.append(positions)
            blocks.append(RowBlock(row, positions.numel(), s.start, s.start + s.length,
                                   positions))
            row += positions.numel()
    if row == seq_len:  # every token computed here: the plain causal path is exact and faster
        return None, [RowBlock.run(0, 0, seq_len)]
    return torch.cat(parts), blocks


def _add_deepstack(h: torch.Tensor, s: SegmentInput, layer: int,
                   computed: torch.Tensor | None) -> None:
    """Qwen3-VL adds visual features to image tokens' outputs of the first D layers; of a
    reused image, to the rows computed at this layer (`computed`, local indices)."""
    feats = s.deepstack[layer]  # [N, H]
    if computed is None:
        h[s.start:s.start + s.length] += feats.to(h.dtype)
    else:
        h[s.start + computed] += feats[computed].to(h.dtype)
