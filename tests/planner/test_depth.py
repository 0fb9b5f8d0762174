"""Depth profile and its exact allocation: brute force agreement, budgets, engine consistency."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from tests.conftest import random_image
from vlcache.engine import Engine
from vlcache.planner.depth import (
    BlockPolicy,
    DepthProfile,
    allocate_depths,
    budget_units,
    depth_plan,
    profile_depths,
)
from vlcache.reuse.policy import RatioPolicy
from vlcache.workloads.cases import Example, make_case


def _brute(errors: np.ndarray, naive: float, budget: float) -> float:
    levels, layers = errors.shape
    units = budget_units(budget, levels, layers)
    best = 0.0
    for depths in itertools.product(range(-1, layers), repeat=levels):
        if any(b > a for a, b in itertools.pairwise(depths)):
            continue
        if sum(d + 1 for d in depths) > units:
            continue
        gains = [0.0 if d < 0 else naive - errors[k, d] for k, d in enumerate(depths)]
        if not any(math.isinf(g) for g in gains):
            best = max(best, sum(gains))
    return best


@pytest.mark.parametrize("seed", range(12))
def test_dp_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    levels, layers = int(rng.integers(2, 4)), int(rng.integers(2, 5))
    errors = rng.uniform(0.0, 2.0, (levels, layers))  # some "gains" are losses (E > naive)
    errors[rng.uniform(size=errors.shape) < 0.2] = math.inf  # unmeasured pairs
    naive = 1.0
    for budget in (0.0, 0.2, 0.5, 1.0):
        alloc = allocate_depths(errors, naive, budget)
        assert alloc.gain == pytest.approx(_brute(errors, naive, budget))
        assert all(b <= a for a, b in itertools.pairwise(alloc.depths))
        assert alloc.units <= budget_units(budget, levels, layers)
        ratios = alloc.ratios(layers)
        assert sum(ratios) / layers <= budget + 1e-9
        assert all(b <= a for a, b in itertools.pairwise(ratios))


def test_depths_become_a_monotone_plan():
    errors = np.full((4, 6), 1.0)
    errors[0, 5] = 0.2  # group 0 through every layer is worth most
    errors[1, 2] = 0.5
    prof = DepthProfile(4, errors, 1.0, 0.5, 1, "m")
    plan = depth_plan(prof, 0.4, 6)
    assert plan.meta["depths"] == [5, 2, -1, -1]
    assert plan.ratios == (0.5, 0.5, 0.5, 0.25, 0.25, 0.25)
    with pytest.raises(ValueError, match="up to 0.5"):
        depth_plan(prof, 0.6, 6)
    with pytest.raises(ValueError, match=">= 0"):
        allocate_depths(errors, 1.0, -0.1)


@pytest.fixture(scope="module")
def engine(tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints["qwen2_5_vl"])


def test_block_policy_computes_one_group_up_to_its_depth(engine):
    first = Example(random_image(41), "What is it?", None, "a", "a")
    case = make_case("single", first)
    for messages in case.cache_messages:
        engine.prefill(messages, policy="full")
    layers = engine.adapter.num_layers
    run = engine.prefill(case.messages, policy=BlockPolicy(1, 4, 1), store_entries=False)
    n = run.prompt.images[0].num_tokens
    size = math.ceil(2 * n / 4) - math.ceil(n / 4)
    assert run.output.reused_computed == [[size, size] + [0] * (layers - 2)]
    # Group 0 through depth d is the plan r_l = 1/G on layers 0..d: the same computation.
    block = engine.prefill(case.messages, policy=BlockPolicy(0, 4, 2), store_entries=False)
    prof = DepthProfile(4, np.where(np.arange(layers) == 2, 0.0, 1.0)[None].repeat(4, 0), 1.0,
                        3 / (4 * layers), 1, "m")
    plan = depth_plan(prof, 3 / (4 * layers), layers)
    assert plan.meta["depths"] == [2, -1, -1, -1]
    same = engine.prefill(case.messages, policy=RatioPolicy(plan), store_entries=False)
    assert np.array_equal(block.output.logits.numpy(), same.output.logits.numpy())


def test_profile_measures_only_the_pairs_a_budget_can_use(engine):
    cases = [make_case("single", Example(random_image(s), "What is it?", None, "a", str(s)))
             for s in (42, 43)]
    prof = profile_depths(engine, cases, 0.25, max_budget=0.25, progress=False)
    layers = engine.adapter.num_layers  # 4 groups x 4 layers, 4 group-layers in budget
    measured = np.isfinite(prof.errors)
    assert measured.tolist() == [[(k + 1) * (d + 1) <= 4 for d in range(layers)]
                                 for k in range(4)]
    assert prof.naive > 0 and prof.cases == 2
    assert (prof.errors[measured] >= 0).all()
