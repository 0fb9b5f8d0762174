"""The bench's arithmetic and bookkeeping, without a model: limit, interleaving, ratios."""

from __future__ import annotations

import pytest

from vlcache.bench.images import allow_tokens, grid_for, synth_image, token_unit
from vlcache.bench.models import FIXTURE_SPEC, reduced_spec
from vlcache.bench.plans import ramp_plan
from vlcache.bench.server import Outcome, summary
from vlcache.bench.timing import (
    Measurement,
    compute_bound_limit,
    per_round_ratios,
    round_order,
    run_rounds,
)
from vlcache.models.synthetic import SIZES, build_image_processor


def test_limit_is_prompt_over_mean_computed():
    # N = 4096 image tokens, T = 100 text tokens, 5% of the image recomputed at every layer
    n, t, layers = 4096, 100, 24
    computed = [t + 205] * layers
    assert compute_bound_limit(n + t, computed) == pytest.approx(4196 / 305)
    assert compute_bound_limit(n + t, [n + t] * layers) == 1.0
    # the mean over layers counts, not the largest layer
    assert compute_bound_limit(200, [200, 100, 50, 50]) == pytest.approx(2.0)
    assert compute_bound_limit(200, []) == 1.0


def test_rounds_rotate_and_cover_every_position():
    names = ["full", "encoder", "naive", "static:0.05"]
    orders = [round_order(names, r) for r in range(len(names))]
    assert all(sorted(o) == sorted(names) for o in orders)
    for position in range(len(names)):  # every case runs first, second, ... once
        assert sorted(o[position] for o in orders) == sorted(names)
    assert round_order(names, 0) == names and round_order(names, 4) == names


def test_run_rounds_interleaves_and_ratios_are_per_round():
    calls: list[str] = []
    times = {"full": [10.0, 20.0], "hit": [1.0, 4.0]}  # the machine slows down in round 1

    def case(name):
        def run():
            calls.append(name)
            return Measurement(ttft_s=times[name][calls.count(name) - 1])
        return run

    samples = run_rounds({"full": case("full"), "hit": case("hit")}, repeat=2)
    assert calls == ["full", "hit", "hit", "full"]
    assert [(s.case, s.round) for s in samples] == [("full", 0), ("hit", 0), ("hit", 1),
                                                     ("full", 1)]
    assert sorted(per_round_ratios(samples, "hit", "full")) == [5.0, 10.0]
    assert all(s.peak_rss is None or s.peak_rss > 0 for s in samples)


def test_synthetic_images_have_the_asked_token_count():
    assert grid_for(1024) == (32, 32) and grid_for(1000) == (25, 40) and grid_for(7) == (1, 7)
    with pytest.raises(ValueError):
        grid_for(0)
    processor = build_image_processor("qwen2_5_vl")  # caps images at 1024 tokens
    allow_tokens(processor, 1100)
    image = synth_image(1100, token_unit(processor))
    grid = processor(images=[image], return_tensors="pt")["image_grid_thw"][0]
    assert int(grid.prod()) // 4 == 1100
    assert synth_image(16, 28, seed=1).tobytes() != synth_image(16, 28, seed=2).tobytes()


def test_ramp_plan_is_monotone_with_the_asked_mean():
    for budget, layers in [(0.05, 24), (0.05, 9), (0.8, 4), (0.0, 3), (1.0, 5), (0.3, 1)]:
        plan = ramp_plan(budget, layers)
        assert plan.num_layers == layers
        assert plan.budget == pytest.approx(budget)
        assert list(plan.ratios) == sorted(plan.ratios, reverse=True)
    with pytest.raises(ValueError):
        ramp_plan(1.5, 4)


def test_reduced_spec_scales_vision_depth_alike():
    spec = reduced_spec(SIZES["qwen2_5_vl-3b"], 9)
    assert (spec.layers, spec.vision_depth, spec.hidden) == (9, 8, 2048)
    assert reduced_spec(FIXTURE_SPEC, None) is FIXTURE_SPEC
    with pytest.raises(ValueError):
        reduced_spec(FIXTURE_SPEC, 25)


def test_server_summary_percentiles():
    outcomes = [Outcome("repeat", 200, 0.1 * i, 1.0, 16) for i in range(1, 11)]
    outcomes += [Outcome("new", 200, 2.0, 3.0), Outcome("new", 503, None, 0.01)]
    rows = {r["kind"]: r for r in summary(outcomes, wall_s=11.0)}
    assert rows["repeat"]["ttft_p50_s"] == pytest.approx(0.5)
    assert rows["repeat"]["ttft_p90_s"] == pytest.approx(0.9)
    assert rows["all"]["requests"] == 12 and rows["all"]["ok"] == 11
    assert rows["all"]["requests_per_s"] == pytest.approx(1.0)
    assert rows["new"]["ok"] == 1


def test_server_requests_count_a_popular_image_as_repeat_only_once_sent():
    import argparse

    from vlcache.bench.server import _bodies

    args = argparse.Namespace(seed=0, popular=2, image_tokens=4, requests=20,
                              repeat_fraction=0.75, max_tokens=2)
    bodies = _bodies(args, "m")
    urls = [b["messages"][0]["content"][1]["image_url"]["url"] for _, b in bodies]
    for i, (kind, body) in enumerate(bodies):
        assert (kind == "repeat") == (urls[i] in urls[:i])
        assert body["stream"] and body["max_tokens"] == 2
    assert 0 < sum(k == "repeat" for k, _ in bodies) < 20
