"""Layer sensitivity S_l(r) for one prompt (design §3), computed without a prefill per (l, r).

"r at layer l only": every image token is reused from the stale cache (built in another
context) at every layer, except that at layer l the first ceil(r·N) tokens of each image (in
the order of the plan's ranking rule: position order for `first`, the question's attention for
`query`) use their exact KV (from the full run of this prompt); text tokens are computed
everywhere. That is
a `naive` prefill whose reused KV at layer l has its first rows replaced, so:

- one naive pass records, per layer, the text rows' inputs and the K/V of every row;
- layers before l are that pass for every r, so each (l, ·) restarts at layer l, and only the
  text rows after the first image (the only ones the image can reach) are recomputed;
- all ratios of one layer run as one batch of variants.

The result equals running the engine's `naive` prefill with the modified cache entry for each
(l, r) (tests/planner/test_sensitivity.py checks this), at a fraction of the cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vlcache.models.adapter import QwenVLAdapter
from vlcache.plan import tokens_for
from vlcache.reuse.rope import apply_rope

KV = tuple[torch.Tensor, torch.Tensor]  # keys, values


@dataclass
class ProbeInputs:
    """One evaluated prompt with its images' stale and exact KV."""

    input_ids: torch.Tensor  # [S]
    positions: torch.Tensor  # [3, S]
    spans: list[tuple[int, int]]  # per image: (first token, N)
    stale: list[KV]  # per image: [L, N, kvh, d] pre-RoPE K and V cached in another context
    exact: list[KV]  # per image: [L, N, kvh, d] pre-RoPE K and V of the full run of this prompt
    target: torch.Tensor  # [V] first-answer-token logits of the full run
    # per image: [N] its tokens in the ranking rule's order (None: position order)
    orders: list[torch.Tensor] | None = None


@dataclass
class _Trace:
    inputs: list[torch.Tensor]  # per layer: [T, H] text rows' inputs
    keys: list[torch.Tensor]  # per layer: [S, kvh, d] rotated keys of every row
    values: list[torch.Tensor]  # per layer: [S, kvh, d]


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
            scale: float) -> torch.Tensor:
    # q [R, c, nh, d]; k, v [R, S, kvh, d]; mask [c, S] -> [R, c, nh*d]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=mask, scale=scale, enable_gqa=True)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)


def _forward(adapter: QwenVLAdapter, h: torch.Tensor, rows: torch.Tensor, first: int,
             kv_at: Callable[[int], KV], cos: torch.Tensor, sin: torch.Tensor,
             trace: _Trace | None = None) -> torch.Tensor:
    """Run R variants of rows `rows` ([c] sequence indices) from layer `first` to the end.

    h: [R, c, H] inputs at layer `first`; kv_at(l) gives [R or 1, S, kvh, d] rotated K/V for
    every row at layer l (the rows in `rows` are overwritten). Returns the last row's output,
    [R, H] (the last layer computes only that row's query and MLP: nothing else is read).
    """
    num, c, hidden = h.shape
    mask = torch.arange(cos.shape[0], device=h.device)[None, :] <= rows[:, None]  # [c, S]
    cos_r, sin_r = cos[rows].repeat(num, 1), sin[rows].repeat(num, 1)  # [R*c, d]
    last = adapter.num_layers - 1
    for layer in range(first, adapter.num_layers):
        x = h.reshape(num * c, hidden)
        q, k, v = adapter.qkv(layer, x)
        q, k = apply_rope(q, cos_r, sin_r), apply_rope(k, cos_r, sin_r)
        keys, values = (t.expand(num, -1, -1, -1).clone() for t in kv_at(layer))
        keys[:, rows] = k.view(num, c, *k.shape[1:])
        values[:, rows] = v.view(num, c, *v.shape[1:])
        if trace is not None:
            trace.inputs.append(h[0].clone())
            trace.keys.append(keys[0])
            trace.values.append(values[0])
        q = q.view(num, c, *q.shape[1:])
        if layer == last:
            q, mask, h = q[:, -1:], mask[-1:], h[:, -1:]
            c = 1
        out = _attend(q, keys, values, mask, adapter.scaling)
        x = h.reshape(num * c, hidden)
        h = adapter.finish(layer, x, out.reshape(num * c, -1)).view(num, c, hidden)
    return h[:, -1]


def _rotated(kv: KV, layer: int, cos: torch.Tensor, sin: torch.Tensor) -> KV:
    return apply_rope(kv[0][layer], cos, sin), kv[1][layer]  # [N, kvh, d] each


def _stale_kv(adapter: QwenVLAdapter, probe: ProbeInputs, cos: torch.Tensor,
              sin: torch.Tensor) -> Callable[[int], KV]:
    seq_len = probe.input_ids.shape[0]

    def kv_at(layer: int) -> KV:
        shape = (1, seq_len, adapter.kv_heads, adapter.head_dim)
        keys = torch.zeros(shape, dtype=adapter.dtype, device=cos.device)
        values = torch.zeros_like(keys)
        for (start, n), stale in zip(probe.spans, probe.stale, strict=True):
            rows = slice(start, start + n)
            keys[0, rows], values[0, rows] = _rotated(stale, layer, cos[rows], sin[rows])
        return keys, values

    return kv_at


def _variants_at(layer: int, trace: _Trace, probe: ProbeInputs, ratios: list[float],
                 cos: torch.Tensor, sin: torch.Tensor) -> KV:
    """[R, S, kvh, d]: the naive pass's K/V at `layer`, the first ceil(r·N) image rows (in the
    rule's order) exact."""
    keys = trace.keys[layer][None].repeat(len(ratios), 1, 1, 1)
    values = trace.values[layer][None].repeat(len(ratios), 1, 1, 1)
    orders = probe.orders or [torch.arange(n, device=cos.device) for _, n in probe.spans]
    for (start, n), exact, order in zip(probe.spans, probe.exact, orders, strict=True):
        rows = slice(start, start + n)
        k, v = _rotated(exact, layer, cos[rows], sin[rows])
        for j, r in enumerate(ratios):
            top = order[:tokens_for(r, n)]
            keys[j, start + top], values[j, start + top] = k[top], v[top]
    return keys, values


def _error(adapter: QwenVLAdapter, h_last: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    z = adapter.logits(h_last)  # [R, V]
    return (z - target.to(z.dtype)).pow(2).sum(dim=-1)  # [R]


@torch.inference_mode()
def sensitivity(adapter: QwenVLAdapter, probe: ProbeInputs,
                ratios: list[float]) -> torch.Tensor:  # [L, len(ratios)] float64
    """||z(r at layer l only) - z_full||² for every layer l and every r in `ratios`."""
    device = adapter.device
    ids = probe.input_ids.to(device)
    seq_len = ids.shape[0]
    is_text = torch.ones(seq_len, dtype=torch.bool, device=device)
    for start, n in probe.spans:
        is_text[start:start + n] = False
    text = is_text.nonzero().squeeze(1)  # [T]
    if text[-1] != seq_len - 1:
        raise ValueError("the prompt must end with a text token (the generation prompt)")
    cos, sin = adapter.rope_tables(probe.positions)  # [S, d]
    trace = _Trace([], [], [])
    h = adapter.embed(ids[text])[None]  # [1, T, H]
    out = _forward(adapter, h, text, 0, _stale_kv(adapter, probe, cos, sin), cos, sin, trace)
    naive = float(_error(adapter, out, probe.target)[0])
    table = torch.full((adapter.num_layers, len(ratios)), naive, dtype=torch.float64)
    live = (text > min(s for s, _ in probe.spans)).nonzero().squeeze(1)  # text rows after
    rows = text[live]
    nonzero = [j for j, r in enumerate(ratios) if r > 0]
    if not nonzero:
        return table
    chosen = [ratios[j] for j in nonzero]
    for layer in range(adapter.num_layers):
        first = _variants_at(layer, trace, probe, chosen, cos, sin)

        def kv_at(m: int, layer: int = layer, first: KV = first) -> KV:
            return first if m == layer else (trace.keys[m][None], trace.values[m][None])

        h0 = trace.inputs[layer][live][None].expand(len(chosen), -1, -1)  # [R, c, H]
        out = _forward(adapter, h0, rows, layer, kv_at, cos, sin)
        table[layer, nonzero] = _error(adapter, out, probe.target).double()
    return table
