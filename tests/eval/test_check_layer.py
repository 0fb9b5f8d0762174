"""CacheBlend's check layer chosen on the planning half (eval/check_layer.py) and the
`cacheblend-check` family of `vlcache eval`."""

from __future__ import annotations

import json

import pytest

from vlcache.cli import main
from vlcache.eval import check_layer, metrics
from vlcache.eval.budget import policy_at
from vlcache.reuse.blend import CacheBlendPolicy
from vlcache.workloads.cases import prime


def test_a_deeper_check_layer_needs_a_larger_budget():
    assert check_layer.feasible(0.05, 24) == [1]  # B·L = 1.2
    assert check_layer.feasible(0.2, 24) == [1, 2, 3, 4]  # B·L = 4.8
    assert check_layer.feasible(0.02, 24) == []  # below one full layer
    ratio = check_layer.ratio_at(0.2, 24, 4)
    assert CacheBlendPolicy(ratio, 4).mean_ratio(24) == pytest.approx(0.2)
    with pytest.raises(ValueError, match="check layers"):
        policy_at("cacheblend-check", 0.2, 24, 100)


def test_the_chosen_layer_has_the_smallest_measured_kl(tiny_text_checkpoints):
    from vlcache.engine import Engine
    from vlcache.workloads.hard import build_cases, load_hard

    engine = Engine.from_pretrained(next(iter(tiny_text_checkpoints.values())))
    cases = build_cases(load_hard(2), ("before", "multihop"))
    budget = 0.6  # the tiny model has few layers: several are feasible
    choices = check_layer.choose(engine, cases, [budget, 0.01], progress=False)
    assert 0.01 not in choices  # no cacheblend can spend it
    choice = choices[budget]
    assert set(choice.kl) == set(check_layer.feasible(budget, engine.num_layers))
    assert len(choice.kl) > 1 and choice.kl[choice.layer] == min(choice.kl.values())
    # each candidate's figure is the mean KL of that policy's run against full
    c = max(choice.kl)
    kls = []
    for case in cases:
        prime(engine, case)
        full = engine.prefill(case.messages, policy="full", store_entries=False)
        run = engine.prefill(case.messages, store_entries=False,
                             policy=CacheBlendPolicy(check_layer.ratio_at(budget,
                                                                          engine.num_layers, c), c))
        kls.append(metrics.kl_divergence(full.output.logits, run.output.logits))
    assert choice.kl[c] == pytest.approx(sum(kls) / len(kls), rel=1e-6, abs=1e-12)
    policy = policy_at("cacheblend-check", budget, engine.num_layers, 100, check_layers=choices)
    assert (policy.layer, policy.mean_ratio(engine.num_layers)) == (
        choice.layer, pytest.approx(budget))


def test_eval_runs_the_family_and_keeps_its_choice(tiny_text_checkpoints, tmp_path):
    model = str(next(iter(tiny_text_checkpoints.values())))
    out = tmp_path / "eval"
    args = ["eval", "--model", model, "--data", "hard", "--limit", "4", "--kinds",
            "before,multihop", "--policies", "naive,cacheblend-check", "--budgets", "0.5,0.75",
            "--profile-limit", "1", "--out", str(out)]
    assert main(args) == 0
    saved = check_layer.load(out / "check-layer.json")
    assert sorted(saved) == [0.5, 0.75] and all(c.cases == 1 for c in saved.values())
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    checked = [r for r in rows if r["family"] == "cacheblend-check"]
    assert len(checked) == 4 * 2
    for r in checked:  # each budget's arm uses the layer chosen for it
        assert r["policy"].endswith(f":{saved[r['budget']].layer}")
    (out / "check-layer.json").write_text(json.dumps({"budgets": [
        {"budget": b, "layer": c.layer, "cases": 99, "kl": c.kl} for b, c in saved.items()]}))
    assert main(args) == 0  # resumed: the saved choice is read back, not measured again
    assert all(c.cases == 99 for c in check_layer.load(out / "check-layer.json").values())
