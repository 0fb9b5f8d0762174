"""CacheBlend's check layer, chosen on the planning half.

CacheBlend computes every reused token up to its check layer c, measures there how far each
token's fresh key is from its cached one, and from then on recomputes only the top share ρ.
At a budget B (mean computed share over L layers) a deeper check layer leaves less for the
layers after it: ρ = (B·L − c) / (L − c), so c can be at most ⌊B·L⌋. Which c is best is an
empirical question per model and workload: this measures, on the planning prompts, the mean
first-token KL(full ‖ cacheblend at c) for every feasible c and keeps the smallest.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from vlcache.engine import Engine
from vlcache.eval import metrics
from vlcache.reuse.blend import CacheBlendPolicy
from vlcache.workloads.cases import Case, prime

CANDIDATES = (1, 2, 3, 4, 6, 8, 12)


def ratio_at(budget: float, num_layers: int, layer: int) -> float | None:
    """ρ that makes cacheblend with check layer `layer` spend `budget`; None if it cannot."""
    ratio = (budget * num_layers - layer) / (num_layers - layer)
    return ratio if 0.0 <= ratio <= 1.0 else None


def feasible(budget: float, num_layers: int,
             candidates: tuple[int, ...] = CANDIDATES) -> list[int]:
    return [c for c in candidates if c < num_layers and ratio_at(budget, num_layers, c) is not None]


@dataclass(frozen=True)
class CheckLayer:
    """The chosen layer at one budget and what each candidate measured."""

    budget: float
    layer: int
    kl: dict[int, float]  # candidate layer -> mean first-token KL(full ‖ cacheblend)
    cases: int

    def policy(self, num_layers: int) -> CacheBlendPolicy:
        ratio = ratio_at(self.budget, num_layers, self.layer)
        assert ratio is not None  # chosen among the feasible layers
        return CacheBlendPolicy(ratio, self.layer)


def choose(engine: Engine, cases: list[Case], budgets: list[float],
           candidates: tuple[int, ...] = CANDIDATES, progress: bool = True
           ) -> dict[float, CheckLayer]:
    """For each budget a cacheblend can spend (c = 1 at least): the feasible check layer with
    the smallest mean first-token KL against full over `cases` (each prompt's segments cached
    in their other contexts, one full run, one run per budget and layer)."""
    if not cases:
        raise ValueError("choosing a check layer needs at least one planning prompt")
    layers = engine.num_layers
    options = {b: feasible(b, layers, candidates) for b in budgets}
    options = {b: cs for b, cs in options.items() if cs}
    sums: dict[float, dict[int, float]] = {b: dict.fromkeys(cs, 0.0) for b, cs in options.items()}
    for case in tqdm(cases, desc="check layer", unit="prompt", disable=not progress):
        prime(engine, case)
        full = engine.prefill(case.messages, policy="full", store_entries=False)
        for b, cs in options.items():
            for c in cs:
                ratio = ratio_at(b, layers, c)
                assert ratio is not None
                run = engine.prefill(case.messages, policy=CacheBlendPolicy(ratio, c),
                                     store_entries=False)
                sums[b][c] += metrics.kl_divergence(full.output.logits, run.output.logits)
    out = {}
    for b, per in sums.items():
        kl = {c: s / len(cases) for c, s in per.items()}
        out[b] = CheckLayer(b, min(kl, key=lambda c: (kl[c], c)), kl, len(cases))
    return out


def save(choices: dict[float, CheckLayer], path: Path) -> None:
    path.write_text(json.dumps({
        "what": "cacheblend's check layer per budget: the feasible layer with the smallest mean "
                "first-token KL(full || cacheblend) over the planning prompts",
        "budgets": [{"budget": c.budget, "layer": c.layer, "cases": c.cases,
                     "kl": {str(k): v for k, v in c.kl.items()}} for c in choices.values()],
    }, indent=2))


def load(path: Path) -> dict[float, CheckLayer]:
    data = json.loads(path.read_text())
    return {float(d["budget"]): CheckLayer(float(d["budget"]), int(d["layer"]),
                                           {int(k): float(v) for k, v in d["kl"].items()},
                                           int(d["cases"]))
            for d in data["budgets"]}
