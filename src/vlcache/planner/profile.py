"""The profiler: S_l(r) (reuse/sensitivity.py) averaged over a proxy data set, and the plan
it implies (planner/allocate.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from vlcache.engine import Engine
from vlcache.plan import Plan
from vlcache.planner.allocate import Allocation, allocate_dp, allocate_greedy, grid_levels
from vlcache.reuse.sensitivity import ProbeInputs
from vlcache.workloads.cases import Case, prime

UNITS = "||z - z_full||^2 over the vocabulary (first answer token), mean over prompts"


@dataclass
class Profile:
    """Mean sensitivity table: table[l, g] = S_l(ratios[g])."""

    ratios: list[float]
    table: np.ndarray  # [L, G+1]
    cases: int
    model: str
    dataset: dict = field(default_factory=dict)
    rule: str = "first"  # the ranking rule the table was measured for

    @property
    def step(self) -> float:
        return self.ratios[1]


def probe_inputs(engine: Engine, case: Case, rule: str = "first") -> ProbeInputs:
    """Prime the case's caches in their other contexts, run it in full, collect both KVs (and,
    for the query rule, each segment's tokens in the order of the question's attention)."""
    prime(engine, case)
    orders = None
    if rule == "query":
        ranked = engine.prefill(case.messages, policy="query:0", store_entries=False)
        orders = [ranked.output.relevance[i].argsort(descending=True)
                  for i in range(len(ranked.prompt.segments))]
    elif rule != "first":
        raise ValueError(f"the profiler measures the first and query rules, not {rule!r}")
    run = engine.prefill(case.messages, policy="full", capture=True, store_entries=False)
    stale, exact, spans = [], [], []
    for i, im in enumerate(run.prompt.segments):  # images and documents
        entry = engine.cached_entry(im.key)
        if entry is None or not entry.has_kv:
            raise RuntimeError(f"the cache of segment {i} was not stored (store too small?)")
        stale.append((entry.keys.to(engine.device, engine.dtype),
                      entry.values.to(engine.device, engine.dtype)))
        exact.append(run.output.captured[i])
        spans.append((im.start, im.num_tokens))
    return ProbeInputs(run.prompt.input_ids, run.positions, spans, stale, exact,
                       run.output.logits, orders)


def profile(engine: Engine, cases: list[Case], step: float, dataset: dict | None = None,
            progress: bool = True, rule: str = "first") -> Profile:
    """Measure S_l(r) on every case for every layer and every r on the grid of step `step`,
    the recomputed tokens chosen by `rule`."""
    levels = grid_levels(step)
    ratios = [g / levels for g in range(levels + 1)]
    total = torch.zeros(engine.num_layers, len(ratios), dtype=torch.float64)
    for case in tqdm(cases, desc="profiling", unit="prompt", disable=not progress):
        total += engine.sensitivity(probe_inputs(engine, case, rule), ratios).cpu()
    return Profile(ratios, (total / max(len(cases), 1)).numpy(), len(cases),
                   str(engine.fingerprint), dataset or {}, rule)


def allocate(prof: Profile, budget: float, method: str = "dp") -> Allocation:
    if method == "dp":
        return allocate_dp(prof.table, budget)
    if method == "greedy":
        return allocate_greedy(prof.table, budget)
    raise ValueError(f"unknown allocation method {method!r}: expected dp or greedy")


def make_plan(prof: Profile, budget: float, method: str = "dp") -> Plan:
    """The plan for `budget`, carrying everything it came from (JSON-ready)."""
    chosen = allocate(prof, budget, method)
    other = allocate(prof, budget, "greedy" if method == "dp" else "dp")
    meta = {
        "model": prof.model,
        "budget_target": budget,
        "grid": prof.step,
        "method": method,
        "objective": chosen.cost,
        f"objective_{'greedy' if method == 'dp' else 'dp'}": other.cost,
        "naive_objective": float(prof.table[:, 0].sum()),
        "sensitivity": {"ratios": prof.ratios, "table": prof.table.tolist(), "units": UNITS,
                        "prompts": prof.cases},
        "dataset": prof.dataset,
    }
    plan = chosen.plan(f"vlcache@{budget:g}" + ("" if prof.rule == "first" else f"/{prof.rule}"),
                       meta)
    return dataclasses.replace(plan, rule=prof.rule)


def load_profile(plan: Plan) -> Profile:
    """The profile a plan file was made from (to re-allocate it at another budget)."""
    s = plan.meta.get("sensitivity")
    if not isinstance(s, dict) or "table" not in s:
        raise ValueError("the plan carries no sensitivity table")
    return Profile(list(s["ratios"]), np.asarray(s["table"], dtype=np.float64),
                   int(s.get("prompts", 0)), str(plan.meta.get("model", "")),
                   dict(plan.meta.get("dataset", {})), plan.rule)


def objectives(prof: Profile, budgets: list[float]) -> list[dict]:
    """Predicted Σ_l S_l(r_l) per budget: DP, greedy, static (where B is on the grid), naive."""
    levels = len(prof.ratios) - 1
    out = []
    for b in budgets:
        row = {"budget": b, "naive": float(prof.table[:, 0].sum()), "static": None,
               "dp": None, "greedy": None, "dp_ratios": None}
        g = round(b * levels)
        if abs(g - b * levels) < 1e-9:
            row["static"] = float(prof.table[:, g].sum())
        try:
            dp = allocate(prof, b, "dp")
            row |= {"dp": dp.cost, "greedy": allocate(prof, b, "greedy").cost,
                    "dp_ratios": " ".join(f"{r:g}" for r in dp.ratios)}
        except ValueError:
            pass
        out.append(row)
    return out
