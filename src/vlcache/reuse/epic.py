"""EPIC / MPIC-k: recompute a fixed number of leading tokens of each reused image at every layer.

EPIC (Hu et al., 2024, "LegoLink") observes that a chunk's first tokens soak up the attention
sink of the context it was cached in, so it recomputes the first K tokens of each chunk. The
count is fixed per image, not a ratio: a small image pays a larger share than a large one.
"""

from __future__ import annotations

import torch

from vlcache.reuse.policy import LayerProbe, Policy, TokenSchedule


class _FirstTokens(TokenSchedule):
    nested = True  # the same first tokens at every layer

    def __init__(self, count: int) -> None:
        self.count = count

    def select(self, layer: int, probe: LayerProbe) -> torch.Tensor:
        return torch.arange(self.count, dtype=torch.long, device=probe.previous.device)


class EpicPolicy(Policy):
    """The first `k` tokens (in position order) of each reused image, at every layer."""

    def __init__(self, k: int) -> None:
        if k < 0:
            raise ValueError(f"epic: the token count must be >= 0, got {k}")
        self.k = k
        self.name = f"epic:{k}"

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        return _FirstTokens(min(self.k, num_tokens))
