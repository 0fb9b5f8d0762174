"""Reuse policies: which cached parts a hit may use and which of its tokens each layer computes.

Every policy (full, encoder, naive, static and the profiled plan here; the baselines of design
§4 in prefix.py, epic.py and blend.py; the ranked ones in ranking.py and guard.py; their names
in registry.py) answers two questions through one interface: may a hit take the encoder entry
and the KV entry, and, layer by layer, which of a reused segment's tokens are computed. The
selection at layer l+1 must be a subset of the one at layer l (a token's layer-l output must
exist to compute it at l+1); the prefill loop checks this unless the schedule is nested by
construction.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vlcache.plan import Plan


@dataclass
class LayerProbe:
    """What a schedule may look at when it chooses layer `layer`'s tokens for one segment."""

    layer: int
    previous: torch.Tensor  # [c] sorted local indices computed at layer-1 (all N at layer 0)
    # Lazily computes ||K_fresh - K_cached||^2 (pre-RoPE, summed over heads) for `previous`: [c]
    deviation: Callable[[], torch.Tensor]
    # The question's attention to each of the segment's N tokens (`relevance_depth` > 0 asks the
    # prefill for it): [N]; None when not computed.
    relevance: torch.Tensor | None = None
    # Analysis only: how far each of the segment's N tokens is from the full run's KV, over all
    # layers (relative squared error of K plus V): [N]; None when no full run was given.
    reference: torch.Tensor | None = None


class TokenSchedule(ABC):
    """Per-segment, per-request token choice; created fresh for each reused segment.

    `restart_layer`: a layer where the schedule starts computing tokens that were not computed
    one layer down (from the entry's cached hidden state entering that layer). The engine uses
    `fallback()` instead when the entry holds no hidden state for that layer.
    """

    restart_layer: int | None = None
    # True when `select` returns a subset of `probe.previous` by construction: the prefill then
    # skips checking it (the check reads tensor values, a host sync on a GPU).
    nested: bool = False
    # Layers of the relevance pass this schedule needs before the prefill (0: none).
    relevance_depth: int = 0

    def fallback(self) -> TokenSchedule:
        """The schedule to follow when the restart layer's hidden state is not cached."""
        return self

    @abstractmethod
    def select(self, layer: int, probe: LayerProbe) -> torch.Tensor:
        """Sorted local indices (int64) to compute at `layer`, a subset of `probe.previous`."""


class Policy(ABC):
    """A named reuse rule. `reuse_encoder`/`reuse_kv` say which cached parts a hit may use."""

    name: str
    reuse_encoder: bool = True
    reuse_kv: bool = True

    @abstractmethod
    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule: ...

    def may_reuse(self, cached_context: torch.Tensor | None, context: torch.Tensor) -> bool:
        """Whether a KV entry computed after `cached_context` may serve an image whose prefix
        digest is now `context` (both [32] uint8; see reuse/prefix.py). Position-independent
        policies say yes; exact prefix caching compares."""
        return True

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


class _PrefixSchedule(TokenSchedule):
    """Computes the first `counts[l]` tokens (in position order) at layer l. With a restart
    layer R (counts 0 below it), the fallback computes layer R's tokens from layer 0 on."""

    def __init__(self, counts: list[int], restart_layer: int | None = None) -> None:
        self.counts = counts
        self.restart_layer = restart_layer
        # monotone counts of first tokens are nested; a restart layer is checked
        self.nested = restart_layer is None and all(
            a >= b for a, b in zip(counts, counts[1:], strict=False))

    def fallback(self) -> TokenSchedule:
        if self.restart_layer is None:
            return self
        r = self.restart_layer
        return _PrefixSchedule([self.counts[r]] * r + self.counts[r:])

    def select(self, layer: int, probe: LayerProbe) -> torch.Tensor:
        return torch.arange(self.counts[layer], dtype=torch.long, device=probe.previous.device)


class RatioPolicy(Policy):
    """Follows a Plan: layer l computes the first ceil(r_l * N) tokens of each reused image."""

    def __init__(self, plan: Plan, name: str | None = None) -> None:
        self.plan = plan
        self.name = name or plan.name

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        if self.plan.num_layers != num_layers:
            raise ValueError(
                f"plan {self.name!r} has {self.plan.num_layers} layers, the model has {num_layers}"
            )
        return _PrefixSchedule([self.plan.tokens_at(layer, num_tokens)
                                for layer in range(num_layers)],
                               self.plan.start_layer or None)


class UniformPolicy(Policy):
    """The same ratio at every layer, for any depth (static:R; naive is static:0)."""

    def __init__(self, ratio: float, name: str | None = None) -> None:
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"static ratio must be in [0, 1], got {ratio}")
        self.ratio = ratio
        self.name = name or f"static:{ratio:g}"

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        plan = Plan.uniform(self.ratio, num_layers)
        return _PrefixSchedule([plan.tokens_at(layer, num_tokens) for layer in range(num_layers)])


class FullPolicy(Policy):
    """No reuse at all: vision tower and full prefill (what a user runs today)."""

    name = "full"
    reuse_encoder = False
    reuse_kv = False

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        raise RuntimeError("the full policy never reuses KV")


class EncoderPolicy(FullPolicy):
    """Reuse the vision-tower output only; the LLM prefill is full."""

    name = "encoder"
    reuse_encoder = True
