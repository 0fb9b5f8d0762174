"""Plans are validated values with a JSON form; policy names parse to the right rules."""

from __future__ import annotations

import pytest

from vlcache.plan import Plan
from vlcache.reuse.policy import (
    EncoderPolicy,
    FullPolicy,
    LayerProbe,
    RatioPolicy,
    UniformPolicy,
)
from vlcache.reuse.registry import parse_policy


def test_plan_json_round_trip(tmp_path):
    plan = Plan((1.0, 0.5, 0.25, 0.0), name="p", meta={"budget_target": 0.4, "grid": 0.25})
    path = tmp_path / "plan.json"
    plan.save(path)
    again = Plan.load(path)
    assert again == plan and again.meta == plan.meta
    assert again.budget == pytest.approx(0.4375)


@pytest.mark.parametrize("ratios", [(), (0.1, 0.2), (1.5,), (-0.1,), (float("nan"),)])
def test_invalid_plans_are_rejected(ratios):
    with pytest.raises(ValueError):
        Plan(ratios)


def test_tokens_at_rounds_up():
    plan = Plan((0.05, 0.0))
    assert plan.tokens_at(0, 100) == 5 and plan.tokens_at(0, 101) == 6
    assert plan.tokens_at(1, 100) == 0


def _probe(layer: int, n: int) -> LayerProbe:
    import torch

    return LayerProbe(layer, torch.arange(n), lambda: torch.zeros(n))


def test_parse_policy_names(tmp_path):
    assert isinstance(parse_policy("full"), FullPolicy)
    assert isinstance(parse_policy("encoder"), EncoderPolicy)
    naive = parse_policy("naive")
    assert isinstance(naive, UniformPolicy) and naive.ratio == 0.0
    static = parse_policy("static:0.25")
    assert static.schedule(8, 3).select(2, _probe(2, 8)).tolist() == [0, 1]
    path = tmp_path / "p.json"
    Plan((1.0, 0.5, 0.0)).save(path)
    planned = parse_policy(f"plan:{path}")
    assert isinstance(planned, RatioPolicy)
    assert [planned.schedule(4, 3).select(i, _probe(i, 4)).numel() for i in range(3)] == [4, 2, 0]
    with pytest.raises(ValueError, match="3 layers"):
        planned.schedule(4, 5)
    for bad in ("static", "static:x", "static:2", "bogus", "plan:/nonexistent.json"):
        with pytest.raises(ValueError):
            parse_policy(bad)


def test_a_plan_may_start_at_a_middle_layer(tmp_path):
    plan = Plan((0.0, 0.0, 0.3, 0.2), name="mid", start_layer=2)
    plan.save(tmp_path / "p.json")
    again = Plan.load(tmp_path / "p.json")
    assert again == plan and again.start_layer == 2 and again.budget == pytest.approx(0.125)
    schedule = RatioPolicy(plan).schedule(10, 4)
    assert schedule.restart_layer == 2
    counts = [len(schedule.select(layer, _probe(layer, 10))) for layer in range(4)]
    assert counts == [0, 0, 3, 2]
    fallback = schedule.fallback()  # no cached hidden state: layer 2's tokens from layer 0 on
    assert fallback.restart_layer is None
    assert [len(fallback.select(layer, _probe(layer, 10))) for layer in range(4)] == [3, 3, 3, 2]
    assert Plan((0.5, 0.2)).start_layer == 0 and '"start_layer"' not in Plan((0.5,)).to_json()


@pytest.mark.parametrize("ratios,start", [((0.1, 0.2, 0.1), 1), ((0.0, 0.2, 0.3), 1),
                                          ((0.1,), 1), ((0.1,), -1)])
def test_invalid_starting_plans_are_rejected(ratios, start):
    with pytest.raises(ValueError):
        Plan(ratios, start_layer=start)
