"""Which rows of one vLLM step each layer computes, which it takes from cache entries, and the
attention "runs" that let vLLM's own paged-attention kernel serve the computed rows.

A vLLM step is a flat batch: request i's scheduled tokens are rows [row, row + count) at prompt
positions [first, first + count). A reused image inside that window computes, at layer l, only
its selected tokens; its other rows are not computed, their K/V come from the entry.

vLLM's varlen causal kernel puts query j of a request with q_len queries and seq_len keys at
position seq_len - q_len + j. The computed rows of one request are not contiguous in position
(a reused image leaves gaps), so each maximal run of consecutive positions becomes a
pseudo-request of its own: q_len = run length, seq_len = run end, same block table. Each row then
attends exactly to the keys at or before its own position, all of which are in the paged cache
once this layer's computed and reused K/V are written.

Pure torch; no vLLM import (tested in vlcache's own environment).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from vlcache.reuse.policy import LayerProbe, Policy


@dataclass(frozen=True)
class Window:
    """One request's scheduled tokens in this step: batch rows [row, row + count) at prompt
    positions [first, first + count)."""

    row: int
    first: int
    count: int


@dataclass
class StepImage:
    """One image of one request in this step.

    A hit has `selections` (per layer, the sorted local indices [0, N) computed there, nested:
    layer l+1's within layer l's) and the entry's `keys`/`values`; a miss with `save` has its
    pre-RoPE K/V written by the model into `captured_keys`/`captured_values` (the worker's
    buffers for the whole image, filled over one or more steps).
    """

    request: int  # index in the step's batch order
    start: int  # prompt position of the image's first token
    num_tokens: int
    mm_hash: str
    selections: list[torch.Tensor] | None = None  # hit: L x [c_l] int64
    keys: torch.Tensor | None = None  # hit: [L, N, kvh, d] pre-RoPE
    values: torch.Tensor | None = None  # hit: [L, N, kvh, d]
    save: bool = False
    captured_keys: torch.Tensor | None = field(default=None, repr=False)  # [L, N, kvh, d]
    captured_values: torch.Tensor | None = field(default=None, repr=False)

    @property
    def hit(self) -> bool:
        return self.selections is not None


@dataclass(frozen=True)
class Reused:
    """Rows of one hit image that a layer takes from its entry."""

    image: int  # index into the step's images
    rows: torch.Tensor  # [u] batch rows
    local: torch.Tensor  # [u] indices into the entry's N tokens


@dataclass(frozen=True)
class Captured:
    """Rows of one saved image inside a layer's computed rows."""

    image: int
    at: torch.Tensor  # [n] indices into the computed rows
    local: torch.Tensor  # [n] indices into the image's N tokens


@dataclass(frozen=True)
class Runs:
    """Pseudo-requests for vLLM's varlen kernel over the computed rows."""

    query_start: torch.Tensor  # [R+1] int32, offsets into the computed rows
    seq_lens: torch.Tensor  # [R] int32, each run's end position (exclusive)
    request: torch.Tensor  # [R] int64, the request each run belongs to (its block table row)

    @property
    def max_query_len(self) -> int:
        return int((self.query_start[1:] - self.query_start[:-1]).max())

    @property
    def max_seq_len(self) -> int:
        return int(self.seq_lens.max())


@dataclass(frozen=True)
class LayerRows:
    """What one layer does: `computed` None means every row (vLLM's own path)."""

    computed: torch.Tensor | None  # [c] sorted batch rows
    reused: tuple[Reused, ...]
    captured: tuple[Captured, ...]
    runs: Runs | None  # None when `computed` is None


class UnservedPolicy(ValueError):
    """A policy whose token choice needs more than the plan (fresh-vs-cached deviation, the
    question's attention): not served inside vLLM."""


def selections_for(policy: Policy, num_tokens: int, num_layers: int) -> list[torch.Tensor]:
    """Per layer, the sorted local indices a policy computes for an image of N tokens."""
    if type(policy).may_reuse is not Policy.may_reuse:
        raise UnservedPolicy(f"policy {policy.name}: reuses KV only after the same context "
                             "(vLLM's own prefix cache does that)")
    schedule = policy.schedule(num_tokens, num_layers)
    if schedule.restart_layer is not None:
        schedule = schedule.fallback()  # no cached hidden states in vLLM entries
    if schedule.relevance_depth:
        raise UnservedPolicy(f"policy {policy.name}: needs the question's attention")

    def no_deviation() -> torch.Tensor:
        raise UnservedPolicy(f"policy {policy.name}: needs fresh-vs-cached deviations")

    previous = torch.arange(num_tokens)
    out = []
    for layer in range(num_layers):
        chosen = schedule.select(layer, LayerProbe(layer, previous, no_deviation))
        chosen = torch.as_tensor(chosen, dtype=torch.long).sort().values
        if not torch.isin(chosen, previous).all():
            raise UnservedPolicy(f"policy {policy.name}: layer {layer} is not nested")
        out.append(chosen)
        previous = chosen
    return out


def plan_layers(windows: list[Window], images: list[StepImage], num_layers: int,
                num_rows: int) -> list[LayerRows]:
    """Each layer's rows for the step. Layers with identical selections share one LayerRows
    (a static plan has one for the whole model)."""
    out: list[LayerRows] = []
    memo: dict[tuple, LayerRows] = {}
    for layer in range(num_layers):
        signature = tuple(tuple(im.selections[layer].tolist()) if im.hit else None
                          for im in images)
        if signature not in memo:
            memo[signature] = _layer_rows(windows, images, layer, num_rows)
        out.append(memo[signature])
    return out


def _image_rows(window: Window, image: StepImage) -> tuple[torch.Tensor, torch.Tensor]:
    """(batch rows, local indices) of the image's tokens scheduled in this window."""
    lo = max(image.start, window.first)
    hi = min(image.start + image.num_tokens, window.first + window.count)
    if hi <= lo:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty
    local = torch.arange(lo - image.start, hi - image.start)
    return local + image.start - window.first + window.row, local


def _layer_rows(windows: list[Window], images: list[StepImage], layer: int,
                num_rows: int) -> LayerRows:
    keep = torch.ones(num_rows, dtype=torch.bool)
    reused: list[Reused] = []
    for i, image in enumerate(images):
        if not image.hit:
            continue
        rows, local = _image_rows(windows[image.request], image)
        chosen = torch.zeros(image.num_tokens, dtype=torch.bool)
        chosen[image.selections[layer]] = True
        skip = ~chosen[local]
        if skip.any():
            reused.append(Reused(i, rows[skip], local[skip]))
            keep[rows[skip]] = False
    if not reused:
        computed = None
    else:
        computed = keep.nonzero().flatten()
    captured = []
    for i, image in enumerate(images):
        if image.save:
            rows, local = _image_rows(windows[image.request], image)
            at = rows if computed is None else torch.searchsorted(computed, rows)
            captured.append(Captured(i, at, local))
    runs = None if computed is None else make_runs(windows, computed)
    return LayerRows(computed, tuple(reused), tuple(captured), runs)


def make_runs(windows: list[Window], computed: torch.Tensor) -> Runs:
    """Maximal runs of consecutive computed rows inside one request, as pseudo-requests.
    `computed` must lie inside the windows (the step's scheduled rows, no padding)."""
    starts = torch.tensor([w.row for w in windows] + [2**62])
    request = torch.searchsorted(starts, computed, right=True) - 1  # [c]
    breaks = torch.ones(computed.numel(), dtype=torch.bool)
    breaks[1:] = (computed[1:] != computed[:-1] + 1) | (request[1:] != request[:-1])
    first_idx = breaks.nonzero().flatten()  # [R]
    query_start = torch.cat([first_idx, torch.tensor([computed.numel()])])
    run_request = request[first_idx]
    last_row = computed[query_start[1:] - 1]
    row0 = torch.tensor([w.row for w in windows])[run_request]
    pos0 = torch.tensor([w.first for w in windows])[run_request]
    seq_lens = last_row - row0 + pos0 + 1
    return Runs(query_start.to(torch.int32), seq_lens.to(torch.int32), run_request)


def layer_kv(rows: LayerRows, images: list[StepImage], layer: int,
             keys: torch.Tensor,  # [c, kvh, d] the computed rows' keys, rotated
             values: torch.Tensor,  # [c, kvh, d]
             rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Everything a layer writes into the paged cache: (batch rows [w], keys [w, kvh, d] after
    RoPE, values [w, kvh, d]): the computed rows' fresh K/V, then each reused row's cached
    pre-RoPE K rotated by `rotate(batch_rows, keys)` at its new position, and its cached V."""
    parts_rows, parts_k, parts_v = [rows.computed], [keys], [values]
    for r in rows.reused:
        image = images[r.image]
        parts_rows.append(r.rows)
        parts_k.append(rotate(r.rows, image.keys[layer, r.local]))
        parts_v.append(image.values[layer, r.local])
    return torch.cat(parts_rows), torch.cat(parts_k), torch.cat(parts_v)
