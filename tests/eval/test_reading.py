"""The synthetic reading set (documents instead of images) and the commands on a text model."""

from __future__ import annotations

import csv

from vlcache.cli import main
from vlcache.engine import Engine
from vlcache.planner.profile import probe_inputs
from vlcache.workloads.cases import prime
from vlcache.workloads.reading import build_cases, load_reading


def test_prime_and_probe_documents_on_a_text_model(tiny_text_checkpoints):
    engine = Engine.from_pretrained(next(iter(tiny_text_checkpoints.values())))
    case = build_cases(load_reading(1))[0]
    prime(engine, case)
    probe = probe_inputs(engine, case)
    assert len(probe.spans) == len(case.cache_messages)
    run = engine.prefill(case.messages, policy="naive", store_entries=False)
    assert run.stats.documents_reused == len(case.cache_messages)
    assert run.stats.text_tokens_reused == sum(n for _, n in probe.spans)


def test_eval_command_on_reading(tiny_text_checkpoints, tmp_path):
    model = str(next(iter(tiny_text_checkpoints.values())))
    out = tmp_path / "eval"
    assert main(["eval", "--model", model, "--data", "reading", "--limit", "4", "--grid", "0.25",
                 "--policies", "naive,static,epic,cacheblend:0.15:1,vlcache",
                 "--budgets", "0.25,0.5", "--out", str(out)]) == 0
    with (out / "summary.csv").open() as f:
        summary = list(csv.DictReader(f))
    assert {s["split"] for s in summary} == {"plan", "heldout"}
    assert all(float(s["exact"]) == 1.0 for s in summary if s["family"] == "full")
    assert all(float(s["computed"]) == 0.0 for s in summary if s["family"] == "naive")
    static = [float(s["computed"]) for s in summary if s["family"] == "static"]
    assert static and all(0.2 <= c <= 0.7 for c in static)
    assert {s["family"] for s in summary} >= {"vlcache", "epic", "cacheblend:0.15:1"}
    assert (out / "plan.json").exists() and (out / "agreement.png").stat().st_size > 0
    assert (out / "sensitivity.png").stat().st_size > 0
