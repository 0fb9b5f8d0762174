"""Ranking rules: which of a reused segment's tokens a layer recomputes, given how many.

A plan (or a uniform ratio) fixes per-layer counts c_0 >= c_1 >= ...; a rule orders the tokens:

- `first`: position order, the paper's rule (a segment's first tokens hold the attention sink of
  the context it was cached in);
- `query`: the attention the prompt's question gives each token (the ProphetKV idea): a relevance
  pass runs the prompt with every reused token stale, and the question's queries at each of its
  first `depth` layers score the reused keys; tokens the question reads most are recomputed;
- `oracle` (analysis only): the tokens whose cached KV is farthest from the full run's, summed
  over layers (one ranking: with nested sets, the choice at layer 0, where KV has no context
  yet, binds every later layer); a ceiling for rules that cannot see the full run.

Counts are monotone and each layer keeps the best-ranked tokens among those computed one layer
down, so the computed sets are nested (a token's layer-l output exists when layer l+1 needs it).
"""

from __future__ import annotations

import torch

from vlcache.plan import RULES, Plan
from vlcache.reuse.policy import LayerProbe, Policy, TokenSchedule


class RankedSchedule(TokenSchedule):
    """Layer l keeps the `counts[l]` best tokens, by `rule`, of those computed at layer l-1."""

    nested = True  # picks among probe.previous

    def __init__(self, counts: list[int], rule: str, relevance_depth: int = 0) -> None:
        if rule not in RULES:
            raise ValueError(f"unknown ranking rule {rule!r}: expected one of {', '.join(RULES)}")
        self.counts = counts
        self.rule = rule
        self.relevance_depth = relevance_depth if rule == "query" else 0

    def select(self, layer: int, probe: LayerProbe) -> torch.Tensor:
        previous = probe.previous
        count = self.counts[layer]
        if count >= previous.numel():
            return previous
        if self.rule == "first" or count == 0:
            return previous[:count]
        top = torch.topk(self._scores(probe), count).indices  # [count]
        return previous[top].sort().values

    def _scores(self, probe: LayerProbe) -> torch.Tensor:  # [c] aligned with probe.previous
        if self.rule == "query":
            if probe.relevance is None:
                raise RuntimeError("the query rule needs the relevance pass (relevance_depth)")
            return probe.relevance[probe.previous]
        if probe.reference is None:
            raise RuntimeError("the oracle rule needs the full run's KV")
        return probe.reference[probe.previous]


class RankedPolicy(Policy):
    """Per-layer counts from a plan (or one ratio at every layer), tokens ordered by a rule.

    `depth` (query rule): layers of the relevance pass, None = all layers.
    """

    def __init__(self, plan: Plan | float, rule: str | None = None, depth: int | None = None,
                 name: str | None = None) -> None:
        self.plan = plan if isinstance(plan, Plan) else None
        self.ratio = None if isinstance(plan, Plan) else float(plan)
        if self.ratio is not None and not 0.0 <= self.ratio <= 1.0:
            raise ValueError(f"ratio must be in [0, 1], got {self.ratio}")
        self.rule = rule or (self.plan.rule if self.plan is not None else "first")
        if self.rule not in RULES:
            raise ValueError(f"unknown ranking rule {self.rule!r}: expected one of "
                             f"{', '.join(RULES)}")
        if depth is not None and depth < 1:
            raise ValueError(f"the relevance pass needs at least one layer, got {depth}")
        self.depth = depth
        tail = f":{depth}" if depth is not None else ""
        self.name = name or (f"{self.rule}:{self.ratio:g}{tail}" if self.plan is None
                             else self.plan.name)

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        plan = self.plan or Plan.uniform(self.ratio, num_layers)
        if plan.num_layers != num_layers:
            raise ValueError(f"plan {self.name!r} has {plan.num_layers} layers, the model has "
                             f"{num_layers}")
        if plan.start_layer:
            raise ValueError(f"plan {self.name!r} starts at layer {plan.start_layer}: only the "
                             "first rule supports a start layer")
        counts = [plan.tokens_at(layer, num_tokens) for layer in range(num_layers)]
        depth = num_layers if self.depth is None else min(self.depth, num_layers)
        return RankedSchedule(counts, self.rule, depth)
