"""The guard at every threshold from the query rows' signals (eval/guard_sweep.py), and the
backfill of signals for rows logged without them (eval/signals.py)."""

from __future__ import annotations

import json
import math

import pytest

from vlcache.cli import main
from vlcache.eval import guard_sweep
from vlcache.eval.runner import Row


def _query(split: str, case: int, exact: bool, signal: float, budget: float = 0.1,
           tokens: int = 100) -> Row:
    return Row(split, case, "before", f"s{case}", "query", budget, f"query:{budget:g}", tokens,
               budget, 0.0, 0.0, exact, exact, None, "a", 0.5, signal=signal)


def test_a_threshold_escalates_the_prompts_above_it():
    rows = [_query("heldout", 0, False, 0.9), _query("heldout", 1, False, 0.05),
            _query("heldout", 2, True, 0.5), _query("heldout", 3, True, 0.01)]
    signals = guard_sweep.signals_of(rows)
    by_t = {p.threshold: p for p in guard_sweep.sweep(rows, signals, (0.0, 0.1, math.inf))}
    never, some, always = by_t[math.inf], by_t[0.1], by_t[0.0]
    assert (never.exact, never.escalated, never.computed) == (0.5, 0.0, pytest.approx(0.1))
    # 0.9 and 0.5 escalate: case 0 is now full's answer, case 1 (0.05) stays wrong
    assert (some.exact, some.escalated) == (0.75, 0.5)
    assert some.computed == pytest.approx((2 * 1.1 + 2 * 0.1) / 4)  # base pass + everything
    assert (always.exact, always.escalated, always.computed) == (1.0, 1.0, pytest.approx(1.1))


def test_calibration_takes_the_largest_threshold_that_meets_the_target_on_the_fit_half():
    plan = [_query("plan", i, i >= 2, s) for i, s in enumerate([0.8, 0.3, 0.2, 0.1, 0.05])]
    held = [_query("heldout", i, i != 1, s) for i, s in enumerate([0.7, 0.25, 0.4, 0.01])]
    signals = guard_sweep.signals_of(plan + held)
    [(fitted, shown)] = guard_sweep.calibrate(plan + held, signals, target=1.0)
    # the wrong planning prompts have signals 0.8 and 0.3: T must stay below 0.3, and the
    # largest candidate below it is 0.2 (a signal seen there)
    assert fitted.threshold == 0.2 and fitted.exact == 1.0
    assert shown.threshold == 0.2 and shown.split == "heldout"
    assert shown.exact == 1.0 and shown.escalated == 0.75  # 0.7, 0.25, 0.4 escalate
    [(loose, _)] = guard_sweep.calibrate(plan + held, signals, target=0.6)
    assert loose.threshold == 0.8 and loose.exact == 0.6  # nothing escalates: 3 of 5
    text = guard_sweep.markdown(plan + held, signals, target=1.0)
    assert "| query:0.1 | 0.2 | 100.0 / " in text


def test_no_signals_no_sweep():
    rows = [_query("heldout", 0, True, 0.1)]
    rows[0].signal = None
    assert guard_sweep.sweep(rows, guard_sweep.signals_of(rows)) == []
    assert guard_sweep.markdown(rows, {}) == ""


def test_the_sweep_equals_the_guards_run(tiny_text_checkpoints):
    """What the sweep derives from a query row is what the guard arm computes at that
    threshold: its answer, its escalation and its computed share."""
    from vlcache.engine import Engine
    from vlcache.eval.runner import Arm, evaluate_case
    from vlcache.reuse.registry import parse_policy
    from vlcache.workloads.hard import build_cases, load_hard

    engine = Engine.from_pretrained(next(iter(tiny_text_checkpoints.values())))
    query = Arm("query", 0.25, parse_policy("query:0.25"))
    for index, case in enumerate(build_cases(load_hard(3), ("before", "multihop", "refer"))):
        [_, q] = evaluate_case(engine, case, [query], "heldout", index)
        assert q.signal is not None and q.signal >= 0
        for threshold in (q.signal / 2, q.signal * 2):
            guard = Arm("guard", 0.25, parse_policy(f"guard:{threshold!r}:0.25"))
            [_, g] = evaluate_case(engine, case, [guard], "heldout", index)
            [p] = guard_sweep.sweep([q], guard_sweep.signals_of([q]), (threshold,))
            assert g.escalated == (q.signal > threshold) == (p.escalated == 1.0)
            assert p.exact == float(g.exact)
            assert p.computed == pytest.approx(g.computed)


def test_backfill_measures_the_signals_rows_lack(tiny_text_checkpoints, tmp_path):
    model = str(next(iter(tiny_text_checkpoints.values())))
    out = tmp_path / "eval"
    args = ["eval", "--model", model, "--data", "hard", "--limit", "4", "--kinds",
            "before,multihop", "--policies", "naive,query", "--budgets", "0.25,0.5",
            "--out", str(out)]
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    measured = {(r["split"], r["case"], r["policy"]): r.pop("signal") for r in rows}
    assert all(v is not None for k, v in measured.items() if k[2].startswith("query"))
    assert all(v is None for k, v in measured.items() if not k[2].startswith("query"))
    assert "the guard at every threshold" in (out / "summary.md").read_text()
    # rows logged before they carried the signal
    (out / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main([*args, "--backfill-signals", "--shard", "0/2"]) == 0
    assert main([*args, "--backfill-signals", "--shard", "1/2"]) == 0
    records = [json.loads(line) for line in (out / "signals.jsonl").read_text().splitlines()]
    assert len(records) == 4 * 2  # every prompt's two query arms, once
    for r in records:
        assert r["signal"] == pytest.approx(measured[(r["split"], r["case"], r["policy"])],
                                            rel=1e-6, abs=1e-9)
    assert "the guard at every threshold" in (out / "summary.md").read_text()
    assert main([*args, "--backfill-signals"]) == 0  # nothing left: no new records
    assert len((out / "signals.jsonl").read_text().splitlines()) == 8
