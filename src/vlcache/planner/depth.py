"""Depth profile: what recomputing one group of an image's tokens through layers 0..d buys.

A monotone plan on a grid of step Δ = 1/G is the same thing as a depth per token group: group k
(an image's tokens from ceil(k·N/G) to ceil((k+1)·N/G), the order `Plan.tokens_at` uses) is
computed at layers 0..d_k and reused above, with d_0 >= d_1 >= ... (d = -1: never computed);
then r_l = #{k : d_k >= l} / G. The layer sensitivity S_l(r) (reuse/sensitivity.py) scores
exact KV at one layer, which no plan produces: a token's KV at layer l is only as good as its
recomputed input, and that input carries the deviation of every layer below (docs/quality.md,
"Plans that start at a middle layer"). This profile instead runs the engine's own selective
prefill for each (group, depth) and records the first-answer-token error
E[k, d] = ||z - z_full||²; the allocation below picks the depths that maximise the summed gains
Σ_k (E_naive - E[k, d_k]) within the budget, assuming the groups' gains add (as S_l assumes the
layers' do).

Only (k, d) pairs that some plan within `max_budget` can use are measured: depths are
non-increasing, so group k at depth d costs at least (k+1)(d+1) group-layers of the G·L·B
the budget allows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from vlcache.engine import Engine
from vlcache.plan import Plan, tokens_for
from vlcache.planner.allocate import grid_levels
from vlcache.reuse.policy import LayerProbe, Policy, TokenSchedule
from vlcache.workloads.cases import Case, prime

NOT_MEASURED = math.inf


def group_start(group: int, levels: int, num_tokens: int) -> int:
    """First token of `group` on a grid of `levels` groups (Plan.tokens_at's rounding)."""
    return tokens_for(group / levels, num_tokens)


class _BlockSchedule(TokenSchedule):
    def __init__(self, start: int, stop: int, depth: int) -> None:
        self.tokens = torch.arange(start, stop, dtype=torch.long)
        self.depth = depth

    def select(self, layer: int, probe: LayerProbe) -> torch.Tensor:
        return self.tokens if layer <= self.depth else self.tokens[:0]


class BlockPolicy(Policy):
    """Recompute one token group of every reused image at layers 0..depth, nothing else."""

    def __init__(self, group: int, levels: int, depth: int) -> None:
        self.group, self.levels, self.depth = group, levels, depth
        self.name = f"block:{group}/{levels}@{depth}"

    def schedule(self, num_tokens: int, num_layers: int) -> TokenSchedule:
        return _BlockSchedule(group_start(self.group, self.levels, num_tokens),
                              group_start(self.group + 1, self.levels, num_tokens), self.depth)


def budget_units(budget: float, levels: int, num_layers: int) -> int:
    """How many group-layers a budget buys (a plan's budget is units / (levels · layers))."""
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    return math.floor(budget * levels * num_layers + 1e-9)


def feasible(group: int, depth: int, units: int) -> bool:
    return (group + 1) * (depth + 1) <= units


@dataclass
class DepthProfile:
    """errors[k, d] = mean E over prompts (inf where not measured); naive = mean E_naive."""

    levels: int
    errors: np.ndarray  # [G, L]
    naive: float
    max_budget: float
    cases: int
    model: str
    dataset: dict = field(default_factory=dict)

    def to_meta(self) -> dict:
        table = [[None if math.isinf(x) else float(x) for x in row] for row in self.errors]
        return {"levels": self.levels, "errors": table, "naive": self.naive,
                "max_budget": self.max_budget, "prompts": self.cases,
                "units": "||z - z_full||^2 (first answer token), mean over prompts"}


def _error(logits: torch.Tensor, target: torch.Tensor) -> float:
    return float((logits.float() - target.float()).pow(2).sum())


def depth_errors(engine: Engine, case: Case, levels: int, units: int) -> tuple[np.ndarray, float]:
    """E[k, d] for one prompt ([G, L], inf where infeasible) and its naive error."""
    prime(engine, case)
    kw = {"store_entries": False, "max_new_tokens": 1}
    target = engine.prefill(case.messages, policy="full", **kw).output.logits
    naive = _error(engine.prefill(case.messages, policy="naive", **kw).output.logits, target)
    num_layers = engine.num_layers
    errors = np.full((levels, num_layers), NOT_MEASURED)
    for k in range(levels):
        for d in range(num_layers):
            if feasible(k, d, units):
                run = engine.prefill(case.messages, policy=BlockPolicy(k, levels, d), **kw)
                errors[k, d] = _error(run.output.logits, target)
    return errors, naive


def profile_depths(engine: Engine, cases: list[Case], step: float, max_budget: float,
                   dataset: dict | None = None, progress: bool = True) -> DepthProfile:
    """Mean E[k, d] over `cases` for every pair some plan within `max_budget` can use."""
    levels = grid_levels(step)
    units = budget_units(max_budget, levels, engine.num_layers)
    total = np.zeros((levels, engine.num_layers))
    naive = 0.0
    for case in tqdm(cases, desc="profiling depths", unit="prompt", disable=not progress):
        errors, e0 = depth_errors(engine, case, levels, units)
        total += errors
        naive += e0
    n = max(len(cases), 1)
    return DepthProfile(levels, total / n, naive / n, max_budget, len(cases),
                        str(engine.fingerprint), dataset or {})


@dataclass(frozen=True)
class DepthAllocation:
    depths: tuple[int, ...]  # per group, non-increasing; -1 = not computed
    gain: float  # predicted Σ_k (naive - E[k, d_k])
    units: int  # group-layers spent

    def ratios(self, num_layers: int) -> tuple[float, ...]:
        levels = len(self.depths)
        return tuple(sum(d >= layer for d in self.depths) / levels for layer in range(num_layers))


def allocate_depths(errors: np.ndarray, naive: float, budget: float) -> DepthAllocation:
    """Exact: the non-increasing depths with the largest summed gain within the budget.

    DP over groups in order; state (depth of the previous group, group-layers spent). Pairs
    marked inf are never chosen. A gain is never forced: leaving a group out is always allowed.
    """
    levels, num_layers = errors.shape
    units = budget_units(budget, levels, num_layers)
    depths = list(range(-1, num_layers))  # index i <-> depth i - 1
    gain = np.where(np.isinf(errors), -np.inf, naive - errors)  # [G, L]
    neg = -np.inf
    # best[i][u]: the best total over groups done so far, previous depth index i, u spent
    best = np.full((len(depths), units + 1), neg)
    best[len(depths) - 1, 0] = 0.0  # before group 0, any depth is allowed
    choice: list[np.ndarray] = []
    for k in range(levels):
        new = np.full_like(best, neg)
        arg = np.full(best.shape + (2,), -1, dtype=np.int64)  # (previous i, previous u)
        for i_prev in range(len(depths)):
            for u in range(units + 1):
                if best[i_prev, u] == neg:
                    continue
                for i in range(i_prev + 1):
                    d = depths[i]
                    cost = d + 1
                    g = 0.0 if d < 0 else gain[k, d]
                    if u + cost > units or g == neg:
                        continue
                    total = best[i_prev, u] + g
                    if total > new[i, u + cost]:
                        new[i, u + cost] = total
                        arg[i, u + cost] = (i_prev, u)
        best = new
        choice.append(arg)
    i, u = np.unravel_index(int(np.argmax(best)), best.shape)
    total = float(best[i, u])
    picked = []
    for k in range(levels - 1, -1, -1):
        picked.append(depths[i])
        i, u = choice[k][i, u]
    out = tuple(reversed(picked))
    return DepthAllocation(out, total, sum(d + 1 for d in out))


def depth_plan(prof: DepthProfile, budget: float, num_layers: int) -> Plan:
    """The plan of the best depths for `budget`, with the profile it came from."""
    if budget > prof.max_budget + 1e-12:
        raise ValueError(f"the depth profile covers budgets up to {prof.max_budget:g}, "
                         f"not {budget:g}")
    alloc = allocate_depths(prof.errors, prof.naive, budget)
    meta = {"model": prof.model, "budget_target": budget, "grid": 1 / prof.levels,
            "method": "depth-dp", "depths": list(alloc.depths), "predicted_gain": alloc.gain,
            "depth_profile": prof.to_meta(), "dataset": prof.dataset}
    return Plan(alloc.ratios(num_layers), name=f"vlcache-depth@{budget:g}", meta=meta)
