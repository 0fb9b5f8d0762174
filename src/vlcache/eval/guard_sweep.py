"""The guard at every threshold, from rows already measured.

`guard:T:B` runs `query:B`, then recomputes the whole request when its signal exceeds T
(reuse/guard.py). Its outcome on a prompt is therefore known without running it once the
`query:B` row of that prompt carries the signal: the query row's own (signal ≤ T), or a full
recompute's (signal > T). A full recompute of every reused token is the full run (the
evaluation's escalated guards agree with full on every prompt where one ran: `escalated_exact`
counts them), and it spends the base pass plus all of the segments (computed 1 + the base's share,
as `eval/runner.py` counts an escalated guard).

So one pass of `query` arms gives the guard's whole agreement / recompute curve, and a threshold
can be *calibrated* on the planning half (the largest T that keeps a target agreement there) and
reported on the held-out half, which did not choose it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from vlcache.eval.bootstrap import interval
from vlcache.eval.runner import Row

Key = tuple[str, int, str]  # (split, case, policy)
GRID = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, math.inf)


@dataclass(frozen=True)
class Point:
    """The guard `guard:threshold:budget` over one half's prompts."""

    split: str
    budget: float
    threshold: float
    n: int
    exact: float
    exact_lo: float | None
    exact_hi: float | None
    computed: float  # token-weighted, as the report's computed share
    escalated: float  # share of prompts recomputed in full


def signals_of(rows: list[Row], extra: dict[Key, float] | None = None) -> dict[Key, float]:
    """Every query row's signal: its own field, else `extra` (a backfill, eval/signals.py)."""
    found = dict(extra or {})
    for r in rows:
        if r.family == "query" and r.signal is not None:
            found[(r.split, r.case, r.policy)] = r.signal
    return found


def _bases(rows: list[Row], signals: dict[Key, float]) -> dict[tuple[str, float], list]:
    """(split, budget) -> [(query row, its signal)] for the query rows that have a signal."""
    out: dict[tuple[str, float], list] = defaultdict(list)
    for r in rows:
        key = (r.split, r.case, r.policy)
        if r.family == "query" and r.budget is not None and key in signals:
            out[(r.split, r.budget)].append((r, signals[key]))
    return out


def escalated_exact(rows: list[Row]) -> tuple[int, int]:
    """(agreeing, measured) over the prompts where an escalated guard ran: the check that a
    full recompute of the reused tokens gives full's answer."""
    seen = {(r.split, r.case): r.exact for r in rows if r.escalated}
    return sum(seen.values()), len(seen)


def point(base: list, split: str, budget: float, threshold: float) -> Point:
    """The guard at `threshold` over `base` [(query row, signal)] of one half."""
    exact, weighted, tokens, up = [], 0.0, 0, 0
    for r, signal in base:
        escalate = signal > threshold
        up += escalate
        exact.append(1.0 if escalate else float(r.exact))
        weighted += (1.0 + r.computed if escalate else r.computed) * r.segment_tokens
        tokens += r.segment_tokens
    bounds = interval(exact)
    return Point(split, budget, threshold, len(base), sum(exact) / len(exact),
                 bounds and bounds[0], bounds and bounds[1], weighted / tokens if tokens else 1.0,
                 up / len(base))


def sweep(rows: list[Row], signals: dict[Key, float],
          thresholds: tuple[float, ...] = GRID) -> list[Point]:
    """The guard at every (split, budget, threshold)."""
    return [point(base, split, budget, t)
            for (split, budget), base in sorted(_bases(rows, signals).items())
            for t in thresholds if base]


def calibrate(rows: list[Row], signals: dict[Key, float], target: float,
              fit: str = "plan", report: str = "heldout") -> list[tuple[Point, Point]]:
    """Per budget: the largest threshold whose guard agrees with full on ≥ `target` of the
    `fit` half's prompts (candidates: 0 and every signal seen there), and that guard on the
    `report` half. A higher threshold recomputes less, so the largest one that meets the target
    is the cheapest."""
    bases = _bases(rows, signals)
    out = []
    for budget in sorted({b for (s, b) in bases if s == fit}):
        fitted, shown = bases.get((fit, budget), []), bases.get((report, budget), [])
        if not fitted or not shown:
            continue
        # every signal seen, largest first, then 0 (escalates every prompt)
        candidates = sorted({0.0, *(s for _, s in fitted)}, reverse=True)
        points = (point(fitted, fit, budget, t) for t in candidates)
        chosen = next((p for p in points if p.exact >= target), point(fitted, fit, budget, 0.0))
        out.append((chosen, point(shown, report, budget, chosen.threshold)))
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def _ci(p: Point) -> str:
    if p.exact_lo is None or p.exact_hi is None:
        return _pct(p.exact)
    return f"{_pct(p.exact)} ({_pct(p.exact_lo)}–{_pct(p.exact_hi)})"


def markdown(rows: list[Row], signals: dict[Key, float], target: float = 0.98,
             split: str = "heldout") -> str:
    """The calibrated guards, then the `split` half's whole sweep; empty without signals."""
    points = sweep(rows, signals)
    if not points:
        return ""
    agreeing, measured = escalated_exact(rows)
    parts = ["### the guard at every threshold (from the query rows' signals)\n",
             f"Escalated runs measured agree with full on {agreeing} of {measured} prompts.\n",
             f"Threshold calibrated on the planning half for ≥ {100 * target:g}% agreement, "
             "reported on the held-out half:\n",
             "| base | threshold | planning: exact / computed | held-out: exact (95% CI) "
             "| held-out computed | held-out escalated |", "|---|---|---|---|---|---|"]
    for fitted, shown in calibrate(rows, signals, target):
        parts.append(f"| query:{fitted.budget:g} | {fitted.threshold:.4g} | "
                     f"{_pct(fitted.exact)} / {_pct(fitted.computed)}% | {_ci(shown)} | "
                     f"{_pct(shown.computed)}% | {_pct(shown.escalated)}% |")
    mine = [p for p in points if p.split == split]
    thresholds = list(dict.fromkeys(p.threshold for p in mine))
    parts += ["", f"{split} half, exact@16 % (computed %) by threshold (rows) and base budget:\n",
              "| threshold | " + " | ".join(f"query:{b:g}" for b in
                                              dict.fromkeys(p.budget for p in mine)) + " |",
              "|---" * (1 + len({p.budget for p in mine})) + "|"]
    for t in thresholds:
        cells = [p for p in mine if p.threshold == t]
        parts.append(f"| {t:g} | " + " | ".join(
            f"{_pct(p.exact)} ({_pct(p.computed)})" for p in cells) + " |")
    return "\n".join(parts) + "\n"
