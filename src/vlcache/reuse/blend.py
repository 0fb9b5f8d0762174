"""Deviation-selected recompute: CacheBlend and KVShare (design §4).

Both pick, at a check layer, the reused tokens whose fresh key deviates most from the cached one
(||K_new - K_cached||², pre-RoPE, summed over heads), and from then on compute only those.
Before the first check layer every token is computed: the deviation at layer l needs the
layer-(l-1) outputs of all tokens, and at layer 0 it is zero (the embedding has no context).

- CacheBlend (Yao et al., 2024; LMCache's defaults: check layer 1, ratio 0.15): one check.
- KVShare (Yang et al., 2025, "Dual-Stage High Deviation"): two checks. The paper's text was not
  reachable here; its abstract says DHD selects high-deviation tokens in two stages, the prefill
  and the decode phase. Our engine decodes exactly over the prefill's KV, so we read the rule as
  two successive high-deviation filters inside the prefill: at `layer1` keep 2·ratio·N
  candidates, at `layer2` re-rank the candidates by their deviation there (now measured on
  recomputed inputs) and keep ratio·N. See docs/quality.md.
"""

from __future__ import annotations

import math

import torch

from vlcache.plan import tokens_for
from vlcache.reuse.policy import LayerProbe, Policy, TokenSchedule


class DeviationSchedule(TokenSchedule):
    """At each check layer keep the `count` highest-deviation tokens among those computed."""

    nested = True  # picks among probe.previous

    def __init__(self, checks: list[tuple[int, int]]) -> None:
        self.checks = dict(checks)  # check layer -> tokens to keep

    def select(self, layer: int, probe: LayerProbe) -> torch.Tensor:
        count = self.checks.get(layer)
        if count is None or count >= probe.previous.numel():
            return probe.previous
        top = torch.topk(probe.deviation(), count).indices  # [count]
        return probe.previous[top].sort().values


def _tokens(ratio: float, n: int) -> int:
    return tokens_for(ratio, n)


def _check_ratio(name: str, ratio: float) -> None:
    if not 0.0 <= ratio <= 1.0 or math.isnan(ratio):
        raise ValueError(f"{name}: ratio must be in [0, 1], got {ratio}")


def _check_layer(name: str, layer: int, num_layers: int) -> None:
    if not 1 <= layer < num_layers:
        raise ValueError(f"{name}: check layer must be in [1, {num_layers - 1}] for a model of "
                         f"{num_layers} layers, got {layer} (layer 0 carries no context)")


class CacheBlendPolicy(Policy):
    """All tokens up to the check layer, then the top `ratio` by key deviation."""

    def __init__(self, ratio: float = 0.15, layer: int = 1) -> None:
        _check_ratio("cacheblend", ratio)
        self.ratio, self.layer = ratio, layer
        self.name = f"cacheblend:{ratio:g}:{layer}"

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        _check_layer(self.name, self.layer, num_layers)
        return DeviationSchedule([(self.layer, _tokens(self.ratio, num_tokens))])

    def mean_ratio(self, num_layers: int) -> float:
        """Share of a reused image's token-layers computed (ignoring the rounding up)."""
        return (self.layer + (num_layers - self.layer) * self.ratio) / num_layers


class KVSharePolicy(Policy):
    """Two high-deviation filters: 2·ratio at `layer1`, then ratio at `layer2` (default L/4)."""

    def __init__(self, ratio: float = 0.15, layer1: int = 1, layer2: int | None = None) -> None:
        _check_ratio("kvshare", ratio)
        self.ratio, self.layer1, self.layer2 = ratio, layer1, layer2
        tail = f":{layer2}" if layer2 is not None else ""
        self.name = f"kvshare:{ratio:g}:{layer1}{tail}"

    def layers(self, num_layers: int) -> tuple[int, int]:
        second = self.layer2 if self.layer2 is not None else max(self.layer1 + 1,
                                                                 num_layers // 4)
        _check_layer(self.name, self.layer1, num_layers)
        _check_layer(self.name, second, num_layers)
        if second <= self.layer1:
            raise ValueError(f"{self.name}: the second check layer must come after the first")
        return self.layer1, second

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        first, second = self.layers(num_layers)
        return DeviationSchedule([(first, _tokens(min(1.0, 2 * self.ratio), num_tokens)),
                                  (second, _tokens(self.ratio, num_tokens))])

    def mean_ratio(self, num_layers: int) -> float:
        first, second = self.layers(num_layers)
        return (first + (second - first) * min(1.0, 2 * self.ratio)
                + (num_layers - second) * self.ratio) / num_layers
