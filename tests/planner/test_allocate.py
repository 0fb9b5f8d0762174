"""The exact allocation equals brute force, never loses to the greedy, and refuses bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from vlcache.planner.allocate import (
    allocate_dp,
    allocate_greedy,
    budget_units,
    grid_levels,
    objective,
)


def _brute(table: np.ndarray, budget: float) -> float:
    layers, columns = table.shape
    units = budget_units(table, budget)
    best = np.inf
    for levels in itertools.product(range(columns), repeat=layers):
        monotone = all(a >= b for a, b in itertools.pairwise(levels))
        if monotone and sum(levels) <= units:
            best = min(best, objective(table, levels))
    return best


def _random_table(rng: np.random.Generator, layers: int, columns: int) -> np.ndarray:
    # mostly decreasing in r (as sensitivities are), with noise and some non-monotone rows
    drops = rng.exponential(1.0, (layers, columns - 1)) * rng.choice([1, -0.3], (layers, 1))
    start = rng.uniform(2, 10, (layers, 1))
    return np.concatenate([start, start - np.cumsum(drops, axis=1)], axis=1)


@pytest.mark.parametrize("seed", range(40))
def test_dp_equals_brute_force_and_beats_greedy(seed):
    rng = np.random.default_rng(seed)
    layers, columns = int(rng.integers(1, 5)), int(rng.integers(2, 6))
    table = _random_table(rng, layers, columns)
    budget = float(rng.choice([0.0, 0.1, 0.25, 0.5, 0.8, 1.0]))
    if budget * layers * (columns - 1) < 1:
        budget = 0.0  # below one grid step: only r = 0 is affordable (non-zero is an error)
    dp, greedy = allocate_dp(table, budget), allocate_greedy(table, budget)
    assert dp.cost == pytest.approx(_brute(table, budget))
    assert dp.cost == pytest.approx(objective(table, dp.levels))
    assert dp.cost <= greedy.cost + 1e-12
    for a in (dp, greedy):
        assert all(x >= y for x, y in itertools.pairwise(a.levels))
        assert a.budget <= budget + 1e-9
        assert all(0.0 <= r <= 1.0 for r in a.ratios)


def test_greedy_can_be_strictly_worse():
    # layer 0 only helps after two steps: the greedy sees no gain in the first and stops
    table = np.array([[5.0, 5.0, 0.0], [1.0, 1.0, 1.0]])
    dp, greedy = allocate_dp(table, 0.5), allocate_greedy(table, 0.5)
    assert dp.levels == (2, 0) and dp.cost == 1.0
    assert greedy.cost > dp.cost


def test_greedy_raises_shallower_layers_to_keep_the_order():
    # layer 0 has no sensitivity of its own (its KV is context-free), layer 1 has
    table = np.array([[1.0, 1.0, 1.0], [10.0, 2.0, 0.0]])
    greedy = allocate_greedy(table, 0.5)
    assert greedy.levels == (1, 1) and greedy.cost == 3.0


def test_plan_from_allocation_is_valid():
    table = np.linspace(5, 0, 21)[None].repeat(24, axis=0) * np.arange(24, 0, -1)[:, None]
    a = allocate_dp(table, 0.05)
    plan = a.plan("p", {"budget": 0.05})
    assert plan.budget <= 0.05 + 1e-12 and plan.num_layers == 24
    assert plan.ratios[0] > 0


@pytest.mark.parametrize("budget", [-0.1, 1.5, float("nan")])
def test_bad_budget_is_an_error(budget):
    with pytest.raises(ValueError, match="budget"):
        allocate_dp(np.zeros((4, 3)), budget)


def test_grid_too_coarse_for_the_budget_is_an_error():
    # 4 layers, step 0.5: the cheapest non-zero plan is 0.125 > 0.1
    with pytest.raises(ValueError, match="finer grid"):
        allocate_dp(np.zeros((4, 3)), 0.1)
    with pytest.raises(ValueError, match="finer grid"):
        allocate_greedy(np.zeros((4, 3)), 0.1)


@pytest.mark.parametrize("step", [0.0, -0.1, 0.3, 1.5])
def test_bad_grid_step_is_an_error(step):
    with pytest.raises(ValueError, match="grid step"):
        grid_levels(step)


@pytest.mark.parametrize("table", [np.zeros((0, 3)), np.zeros((3, 1)), np.zeros(3),
                                   np.array([[0.0, np.nan]])])
def test_bad_tables_are_errors(table):
    with pytest.raises(ValueError, match="sensitivity table"):
        allocate_dp(table, 0.5)
