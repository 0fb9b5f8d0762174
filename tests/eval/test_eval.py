"""Evaluation pieces: metrics, equal-budget settings, reports, and the two commands."""

from __future__ import annotations

import csv
import json

import pytest
import torch

from vlcache.cli import main
from vlcache.eval import metrics
from vlcache.eval.budget import policy_at
from vlcache.plan import Plan
from vlcache.reuse.registry import parse_policy


def test_metrics():
    z = torch.tensor([2.0, 1.0, -1.0])
    assert metrics.kl_divergence(z, z) == 0.0 and metrics.logits_mse(z, z) == 0.0
    other = torch.tensor([1.0, 2.0, -1.0])
    assert metrics.kl_divergence(z, other) > 0 and not metrics.top1_agrees(z, other)
    assert metrics.answer_correct("Yes, it is.", "Yes") is True
    assert metrics.answer_correct("no", "Yes") is False
    assert metrics.answer_correct("", "red") is False
    assert metrics.answer_correct("anything", None) is None
    p = torch.softmax(z.double(), dim=-1)
    assert metrics.top_margin(z) == pytest.approx(float(p[0] - p[1]))
    assert metrics.top_margin(torch.tensor([3.0, 3.0, 0.0])) == 0.0  # a tie


def test_by_margin_splits_cases_by_full_confidence():
    from vlcache.eval.report import by_margin
    from vlcache.eval.runner import Row

    def row(case: int, family: str, exact: bool, margin: float, budget=None) -> Row:
        return Row("heldout", case, "single", "s", family, budget, family, 10, 0.0, 0.0, 0.0,
                   exact, exact, None, "a", margin)

    rows = [row(0, "full", True, 0.05), row(0, "naive", False, 0.05),
            row(1, "full", True, 0.9), row(1, "naive", True, 0.9),
            row(2, "full", True, 0.6), row(2, "naive", True, 0.6),
            row(2, "static", True, 0.6, budget=0.05), row(2, "static", False, 0.6, budget=0.1)]
    table = by_margin(rows, 0.05).splitlines()
    assert "(n=1)" in table[0] and "(n=2)" in table[0]
    assert table[2] == "| naive | 0.0% | 100.0% |"
    assert table[3] == "| static | – | 100.0% |"  # the 10% arm is not in the 5% table


@pytest.mark.parametrize("budget", [0.05, 0.1, 0.2])
def test_baselines_spend_the_target_budget(budget):
    layers = 24
    assert policy_at("static", budget, layers, 300).ratio == budget
    assert policy_at("epic", budget, layers, 300).k == round(budget * 300)
    assert policy_at("cacheblend", budget, layers, 300).mean_ratio(layers) == pytest.approx(budget)
    assert policy_at("kvshare", budget, layers, 300).mean_ratio(layers) == pytest.approx(budget)
    assert policy_at("cacheblend", 0.02, layers, 300) is None  # below one full layer (1/24)
    with pytest.raises(ValueError, match="profile"):
        policy_at("vlcache", budget, layers, 300)


def test_profile_and_eval_commands(tiny_checkpoints, tmp_path):
    model = str(tiny_checkpoints["qwen2_5_vl"])
    plan_file = tmp_path / "plan.json"
    common = ["--model", model, "--data", "random", "--limit", "4", "--grid", "0.25",
              "--kinds", "single,reorder"]
    assert main(["profile", *common, "--budget", "0.3", "--out", str(plan_file)]) == 0
    plan = Plan.load(plan_file)
    assert plan.budget <= 0.3 and plan.num_layers == 4
    assert {"model", "budget_target", "grid", "sensitivity", "dataset"} <= set(plan.meta)
    assert len(plan.meta["sensitivity"]["table"]) == 4
    assert isinstance(parse_policy(f"vlcache:{plan_file}").plan, Plan)
    out = tmp_path / "eval"
    assert main(["eval", *common, "--policies", "naive,prefix,static,cacheblend,vlcache",
                 "--budgets", "0.1,0.5", "--profile", str(plan_file), "--out", str(out)]) == 0
    with (out / "summary.csv").open() as f:
        summary = list(csv.DictReader(f))
    full = [s for s in summary if s["family"] == "full" and s["kind"] == "all"]
    assert len(full) == 2 and all(float(s["exact"]) == 1.0 for s in full)
    naive = [s for s in summary if s["family"] == "naive"]
    assert all(float(s["computed"]) == 0.0 for s in naive)
    assert {s["split"] for s in summary} == {"plan", "heldout"}
    assert not any(s["family"] == "cacheblend" and s["budget"] == "0.1" for s in summary)
    assert (out / "agreement.png").stat().st_size > 0 and (out / "summary.md").exists()
    with (out / "rows.csv").open() as f:
        margins = [float(r["margin"]) for r in csv.DictReader(f)]
    assert margins and all(0.0 <= m <= 1.0 for m in margins)
    with (out / "objectives.csv").open() as f:
        objectives = {float(r["budget"]): r for r in csv.DictReader(f)}
    assert float(objectives[0.5]["dp"]) <= float(objectives[0.5]["greedy"]) + 1e-9
    assert float(objectives[0.5]["dp"]) <= float(objectives[0.5]["static"]) + 1e-9
    assert "cacheblend@0.1" in " ".join(json.loads((out / "run.json").read_text())["skipped"])
    # `vlcache report` rebuilds the summary from the rows and run.json alone
    before = (out / "summary.csv").read_text(), (out / "summary.md").read_text()
    (out / "summary.md").unlink()
    (out / "summary.csv").write_text("stale")
    assert main(["report", str(out)]) == 0
    assert ((out / "summary.csv").read_text(), (out / "summary.md").read_text()) == before
    assert main(["report", str(tmp_path)]) == 2  # no rows there


def test_epic_is_sized_per_half_to_spend_the_budget(tiny_checkpoints, tmp_path):
    # a fixed K spends K / mean N of a half's segment tokens, so each half gets its own K
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(tiny_checkpoints["qwen2_5_vl"]), "--data", "random",
                 "--limit", "6", "--kinds", "single,reorder", "--policies", "epic",
                 "--budgets", "0.25", "--out", str(out)]) == 0
    means = json.loads((out / "run.json").read_text())["mean_segment_tokens"]
    with (out / "summary.csv").open() as f:
        epic = {s["split"]: s for s in csv.DictReader(f)
                if s["family"] == "epic" and s["kind"] == "all"}
    assert set(epic) == {"plan", "heldout"}
    for split, row in epic.items():
        k = max(1, round(0.25 * means[split]))
        assert row["policy"] == f"epic:{k}"
        assert float(row["computed"]) == pytest.approx(k / means[split], abs=1e-6)


def test_rows_survive_the_csv_round_trip(tmp_path):
    from vlcache.eval.report import read_rows, write_csv
    from vlcache.eval.runner import Row

    rows = [Row("plan", 3, "before", "synthetic/count/7", "static", 0.05, "static:0.05", 140,
                0.053, 0.02, 0.1, True, False, None, "3", 0.25),
            Row("heldout", 0, "single", "s", "full", None, "full", 64, 1.0, 0.0, 0.0, True,
                True, False, "no", 0.5)]
    write_csv([r.as_dict() for r in rows], tmp_path / "rows.csv")
    assert read_rows(tmp_path / "rows.csv") == rows


def test_by_full_correct_separates_cases_where_full_is_wrong():
    from vlcache.eval.report import by_full_correct
    from vlcache.eval.runner import Row

    def row(case: int, family: str, exact: bool, correct: bool | None, budget=None) -> Row:
        return Row("plan", case, "single", "s", family, budget, family, 10, 0.0, 0.0, 0.0,
                   exact, exact, correct, "a", 0.5)

    rows = [row(0, "full", True, True), row(0, "naive", False, False),
            row(1, "full", True, True), row(1, "naive", True, True),
            row(2, "full", True, False), row(2, "naive", False, True),  # naive fixes full
            row(2, "static", True, False, budget=0.05), row(0, "static", True, True, 0.05),
            row(1, "static", False, False, budget=0.1)]  # another budget: not counted
    table = by_full_correct(rows, 0.05).splitlines()
    assert "full right (n=2)" in table[0] and "full wrong (n=1)" in table[0]
    assert table[2] == "| naive | 50.0% | 0.0% | 100.0% |"
    assert table[3] == "| static | 100.0% | 100.0% | 0.0% |"
    no_answers = [Row(**(r.as_dict() | {"correct": None})) for r in rows]
    assert by_full_correct(no_answers, 0.05) == ""


def test_commands_report_bad_input(tiny_checkpoints, tmp_path, capsys):
    model = str(tiny_checkpoints["qwen2_5_vl"])
    assert main(["profile", "--model", model, "--data", "random", "--limit", "2",
                 "--budget", "-1", "--out", str(tmp_path / "p.json")]) == 2
    assert "budget" in capsys.readouterr().err
    assert main(["eval", "--model", str(tmp_path), "--data", "random"]) == 2


def test_eval_with_the_depth_planned_family(tiny_checkpoints, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(tiny_checkpoints["qwen2_5_vl"]), "--data", "random",
                 "--limit", "4", "--grid", "0.25", "--kinds", "single,reorder",
                 "--policies", "static,vlcache-depth", "--budgets", "0.05,0.25",
                 "--out", str(out)]) == 0
    plan = Plan.load(out / "plan-depth.json")  # the 0.05 plan: 4 group-layers of 16 at most
    assert plan.budget <= 0.05 + 1e-9 and plan.meta["method"] == "depth-dp"
    with (out / "summary.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["family"] == "vlcache-depth"]
    assert sorted({r["budget"] for r in rows}) == ["0.05", "0.25"]
    assert all(float(r["computed"]) <= float(r["budget"]) + 0.1 for r in rows)
    plan_file = tmp_path / "depth.json"
    assert main(["profile", "--model", str(tiny_checkpoints["qwen2_5_vl"]), "--data", "random",
                 "--limit", "2", "--grid", "0.25", "--budget", "0.25", "--method", "depth",
                 "--out", str(plan_file)]) == 0
    plan = Plan.load(plan_file)
    assert plan.budget <= 0.25 and len(plan.meta["depths"]) == 4
    assert len(plan.meta["depth_profile"]["errors"]) == 4
