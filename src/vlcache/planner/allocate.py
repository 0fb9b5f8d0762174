"""Budget allocation (design §3): per-layer ratios minimising Σ_l S_l(r_l).

Constraints: r_1 >= r_2 >= ... >= r_L, each r_l on the grid {0, Δ, ..., 1}, mean(r) <= B.
Ratios are handled as integer levels g_l = r_l / Δ, so the budget is an integer number of units
K = floor(B·L/Δ). The problem is separable along a monotone chain, so dynamic programming over
(layer, level, units used) solves it exactly in O(L·G·K); the greedy of the paper is kept as a
baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vlcache.plan import Plan


@dataclass(frozen=True)
class Allocation:
    """A solution: the level of each layer, its ratios and its objective Σ_l S_l(r_l)."""

    levels: tuple[int, ...]
    step: float  # Δ
    cost: float

    @property
    def ratios(self) -> tuple[float, ...]:
        return tuple(round(g * self.step, 12) for g in self.levels)

    @property
    def budget(self) -> float:
        return sum(self.ratios) / len(self.levels)

    def plan(self, name: str, meta: dict | None = None) -> Plan:
        return Plan(self.ratios, name=name, meta=meta or {})


def grid_levels(step: float) -> int:
    """G for a grid step Δ = 1/G; a step that does not divide 1 is an error."""
    if not 0.0 < step <= 1.0 or math.isnan(step):
        raise ValueError(f"grid step must be in (0, 1], got {step}")
    levels = round(1.0 / step)
    if abs(levels * step - 1.0) > 1e-9:
        raise ValueError(f"grid step {step} does not divide 1 (use 1/G for an integer G)")
    return levels


def budget_units(table: np.ndarray, budget: float) -> int:
    """K = floor(B·L·G): how many grid steps the budget buys, summed over layers."""
    if not 0.0 <= budget <= 1.0 or math.isnan(budget):
        raise ValueError(f"budget must be a mean ratio in [0, 1], got {budget}")
    num_layers, columns = table.shape
    units = math.floor(budget * num_layers * (columns - 1) + 1e-9)
    if budget > 0 and units == 0:
        raise ValueError(
            f"budget {budget:g} is below the cheapest non-zero plan on this grid "
            f"(one step of {1 / (columns - 1):g} at one of {num_layers} layers = "
            f"{1 / ((columns - 1) * num_layers):.4g}); use a finer grid"
        )
    return units


def _check_table(table: np.ndarray) -> np.ndarray:
    table = np.asarray(table, dtype=np.float64)
    if table.ndim != 2 or table.shape[0] < 1 or table.shape[1] < 2:
        raise ValueError(f"sensitivity table must be [layers, grid points >= 2], got "
                         f"{table.shape}")
    if not np.isfinite(table).all():
        raise ValueError("sensitivity table has NaN or infinite entries")
    return table


def allocate_dp(table: np.ndarray, budget: float) -> Allocation:
    """The exact optimum. `table[l, g]` = S_l(g·Δ) with Δ = 1/(columns-1)."""
    table = _check_table(table)
    units = budget_units(table, budget)
    num_layers, columns = table.shape
    # best[g, u]: min cost of the layers so far, the last at level g, u units used in all
    best = np.full((columns, units + 1), np.inf)
    for g in range(min(columns, units + 1)):
        best[g, g] = table[0, g]
    back = []  # per layer >= 1: [columns, units+1] the previous layer's level
    for layer in range(1, num_layers):
        sufval, sufarg = _suffix_min(best)
        new = np.full_like(best, np.inf)
        arg = np.zeros(best.shape, dtype=np.int64)
        for g in range(min(columns, units + 1)):
            new[g, g:] = table[layer, g] + sufval[g, :units + 1 - g]
            arg[g, g:] = sufarg[g, :units + 1 - g]
        best = new
        back.append(arg)
    g, u = np.unravel_index(np.argmin(best), best.shape)
    cost = float(best[g, u])
    levels = [int(g)]
    for arg in reversed(back):
        prev = int(arg[g, u])
        u, g = u - g, prev
        levels.append(g)
    return Allocation(tuple(reversed(levels)), 1.0 / (columns - 1), cost)


def _suffix_min(best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """min and argmin over levels g' >= g, for every g and units u."""
    val = best.copy()
    arg = np.repeat(np.arange(best.shape[0])[:, None], best.shape[1], axis=1)
    for g in range(best.shape[0] - 2, -1, -1):
        later = val[g + 1] < val[g]
        val[g] = np.where(later, val[g + 1], val[g])
        arg[g] = np.where(later, arg[g + 1], arg[g])
    return val, arg


def allocate_greedy(table: np.ndarray, budget: float) -> Allocation:
    """The paper's greedy (layers treated as independent), made to respect the monotone order.

    From r = 0, repeatedly take the move with the largest drop of Σ S per grid step spent, where
    a move raises one layer by one step together with every shallower layer that would
    otherwise fall below it; stop when no affordable move lowers the objective.
    """
    table = _check_table(table)
    units = budget_units(table, budget)
    num_layers, columns = table.shape
    levels = [0] * num_layers
    used = 0
    while True:
        best = None  # (gain per step, -layer, steps)
        for i in range(num_layers):
            target = levels[i] + 1
            if target >= columns:
                continue
            raised = [k for k in range(i + 1) if levels[k] < target]
            steps = sum(target - levels[k] for k in raised)
            gain = sum(table[k, levels[k]] - table[k, target] for k in raised)
            if used + steps <= units and gain > 0 and (best is None or gain / steps > best[0]):
                best = (gain / steps, i, steps)
        if best is None:
            break
        _, i, steps = best
        for k in range(i + 1):
            levels[k] = max(levels[k], levels[i] + 1)
        used += steps
    cost = float(sum(table[i, g] for i, g in enumerate(levels)))
    return Allocation(tuple(levels), 1.0 / (columns - 1), cost)


def objective(table: np.ndarray, levels: tuple[int, ...]) -> float:
    return float(sum(np.asarray(table)[i, g] for i, g in enumerate(levels)))
