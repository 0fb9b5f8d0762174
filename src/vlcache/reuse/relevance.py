"""The relevance pass: how much the prompt's question attends to each reused token.

Before a `query`-ranked prefill, the prompt runs through its first `depth` layers with every
reused token stale (only the tokens outside reused segments are computed, as in `naive`). At each
layer the probe rows (the question: the text of the last user turn) score every key of the
sequence with their own queries; a reused token's relevance is its softmax attention mass,
averaged over probe rows, heads and layers. The probe ignores causality (a question placed before
a document still scores it): the scores only rank tokens. Its cost is a naive prefill of the
text rows over `depth` layers.
"""

from __future__ import annotations

import torch

from vlcache.models.adapter import QwenVLAdapter
from vlcache.reuse.layer import CachedSpan, Rows, layer_step

SCORE_ELEMENTS = 1 << 24  # per chunk of probe rows: heads x rows x keys


def attention_mass(q: torch.Tensor,  # [P, nh, d] rotated probe queries
                   keys: torch.Tensor,  # [S, kvh, d] rotated keys
                   scale: float) -> torch.Tensor:  # [S] mean softmax mass per key
    heads, kv_heads = q.shape[1], keys.shape[1]
    k = keys.repeat_interleave(heads // kv_heads, dim=1).transpose(0, 1)  # [nh, S, d]
    step = max(1, SCORE_ELEMENTS // max(heads * keys.shape[0], 1))
    total = torch.zeros(keys.shape[0], dtype=torch.float32, device=keys.device)
    for r in range(0, q.shape[0], step):
        qh = q[r:r + step].transpose(0, 1)  # [nh, p, d]
        weights = torch.softmax((qh @ k.transpose(1, 2)).float() * scale, dim=-1)  # [nh, p, S]
        total += weights.sum(dim=(0, 1))
    return total / (heads * q.shape[0])


def relevance(adapter: QwenVLAdapter,
              embeds: torch.Tensor,  # [S, H]
              cos: torch.Tensor, sin: torch.Tensor,  # [S, d]
              rows: Rows,  # the rows outside reused segments
              spans: list[tuple[int, torch.Tensor, torch.Tensor]],  # (start, K, V [L, N, kvh, d])
              probe: torch.Tensor,  # [P] sequence positions of the probe rows (within rows)
              depth: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (relevance of every position [S], the last row's hidden state after `depth` layers
    [H]; after all layers it is `naive`'s, which the guard compares against)."""
    h = embeds.clone()
    index = rows.index if rows.index is not None else torch.arange(h.shape[0],
                                                                   device=h.device)
    local = torch.searchsorted(index, probe)  # [P] probe rows among the computed rows
    mass = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
    for layer in range(depth):
        cached = [CachedSpan(start, k[layer], v[layer]) for start, k, v in spans]
        step = layer_step(adapter, layer, h, rows, cached, cos, sin)
        h[index] = step.hidden
        mass += attention_mass(step.queries[local], step.rotated, adapter.scaling)
    return mass / depth, h[-1]


def question_rows(input_ids: torch.Tensor,  # [S]
                  spans: list[tuple[int, int]],  # (start, length) of every segment
                  turn_ids: set[int]) -> torch.Tensor:  # [P]
    """The probe: the rows of the last user turn that belong to no segment.

    The last turn marker opens the assistant's answer (the generation prompt), so the user turn
    starts at the one before it; without markers, every row outside segments is a probe row.
    """
    marks = [i for i, t in enumerate(input_ids.tolist()) if t in turn_ids]
    start = marks[-2] if len(marks) >= 2 else 0
    keep = torch.zeros(input_ids.shape[0], dtype=torch.bool)
    keep[start:] = True
    for a, n in spans:
        keep[a:a + n] = False
    return keep.nonzero().squeeze(1)
