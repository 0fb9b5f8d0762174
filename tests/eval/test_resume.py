"""Resumable evaluation (rows.jsonl), bootstrap intervals, and the report that shows them."""

from __future__ import annotations

import csv
import json

import pytest

from vlcache.cli import main
from vlcache.eval import runner
from vlcache.eval.bootstrap import interval
from vlcache.eval.budget import policy_at
from vlcache.eval.report import ALL, summarize, summary_markdown
from vlcache.eval.rowlog import RowLog
from vlcache.eval.runner import Row


def _row(case: int, family: str, exact: bool, kind: str = "after", budget=None,
         split: str = "heldout") -> Row:
    return Row(split, case, kind, f"s{case}", family, budget, family if budget is None
               else f"{family}:{budget:g}", 100, 0.0 if budget is None else budget, 0.0, 0.0,
               exact, exact, exact, "a", 0.5)


def _agreement(out) -> list[dict]:
    """summary.csv without its timings (which change when a prompt is rerun)."""
    with (out / "summary.csv").open() as f:
        return [{k: v for k, v in s.items() if k not in {"seconds", "select_s"}}
                for s in csv.DictReader(f)]


def test_interval_holds_the_estimate_and_shrinks_with_more_prompts():
    few = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    many = few * 40
    low, high = interval(few)
    assert low <= sum(few) / len(few) <= high
    big_low, big_high = interval(many)
    assert big_low <= sum(many) / len(many) <= big_high
    assert big_high - big_low < (high - low) / 3  # ~ 1/sqrt(40)
    assert interval(few) == interval(few)  # seeded
    assert interval([1.0] * 5) == (1.0, 1.0) and interval([]) is None


def test_rowlog_keeps_finished_prompts_only(tmp_path):
    log = RowLog(tmp_path / "rows.jsonl")
    log.append([_row(0, "full", True).as_dict(), _row(0, "naive", False).as_dict()])
    log.append([_row(1, "full", True).as_dict(), _row(1, "naive", True).as_dict()])
    log.append([_row(2, "full", True).as_dict()])  # cut off before its second row
    with log.path.open("a") as f:
        f.write('{"split": "heldout", "ca')  # a line cut off mid-write
    expected = {("heldout", i): (2, f"s{i}") for i in range(3)}
    expected[("heldout", 1)] = (2, "another source")  # the prompt is no longer the same
    done = log.read(expected)
    assert set(done) == {("heldout", 0)}
    assert [Row.from_dict(d) for d in done[("heldout", 0)]] == [_row(0, "full", True),
                                                                _row(0, "naive", False)]
    assert len(log.path.read_text().splitlines()) == 2  # the rest is dropped from the file


def test_summary_and_markdown_carry_intervals_by_kind():
    rows = []
    for case in range(20):
        kind = "before" if case % 2 else "after"
        rows += [_row(case, "full", True, kind),
                 _row(case, "naive", case % 4 == 0, kind),
                 _row(case, "static", case % 2 == 0, kind, budget=0.05)]
    summary = summarize(rows)
    static = {s["kind"]: s for s in summary if s["family"] == "static"}
    assert set(static) == {ALL, "after", "before"}
    assert static[ALL]["exact"] == 0.5 and static["after"]["exact"] == 1.0
    low, high = interval([float(case % 2 == 0) for case in range(20)])
    assert (static[ALL]["exact_lo"], static[ALL]["exact_hi"]) == (low, high)
    assert low < 0.5 < high
    text = summary_markdown(rows, [0.05, 0.1])
    assert f"| static | 50.0 ({100 * low:.1f}–{100 * high:.1f}) | n/a |" in text
    assert "### kind `before`" in text and "### kind `after`" in text
    assert "| static | 0.0 (0.0–0.0) | n/a |" in text  # the before kind, static never agrees
    assert "| computed (measured) |" in text


def test_new_families_spend_the_budget():
    query, oracle, guard = (policy_at(f, 0.1, 24, 300) for f in ("query", "oracle", "guard"))
    assert (query.name, oracle.name) == ("query:0.1", "oracle:0.1")
    assert guard.base.ratio == 0.1 and guard.name.endswith(":0.1")


def _count_prompts(monkeypatch) -> list[tuple[str, int]]:
    """(split, index) of every prompt evaluated from now on, in order."""
    calls: list[tuple[str, int]] = []
    real = runner.evaluate_case

    def counted(engine, case, arms, split, index):
        calls.append((split, index))
        return real(engine, case, arms, split, index)

    monkeypatch.setattr(runner, "evaluate_case", counted)
    return calls


def test_eval_resumes_where_it_stopped(tiny_text_checkpoints, tmp_path, monkeypatch):
    model = str(next(iter(tiny_text_checkpoints.values())))
    out = tmp_path / "eval"
    args = ["eval", "--model", model, "--data", "hard", "--limit", "4", "--kinds",
            "before,multihop", "--policies", "naive,query,oracle,guard:0:0.25",
            "--budgets", "0.25", "--out", str(out)]
    assert main(args) == 0
    lines = (out / "rows.jsonl").read_text().splitlines()
    assert len(lines) == 4 * 5  # full, naive, query, oracle, guard per prompt
    rows = [json.loads(line) for line in lines]
    guard = [r for r in rows if r["family"] == "guard:0:0.25"]
    assert all(r["escalated"] for r in guard)  # threshold 0: always escalates
    assert all(r["computed"] > 1.2 for r in guard)  # a full recompute plus its base pass
    assert all(r["seconds"] > 0 for r in rows)
    with (out / "summary.csv").open() as f:
        summary = {(s["split"], s["kind"], s["family"]): s for s in csv.DictReader(f)}
    assert float(summary[("heldout", ALL, "oracle")]["exact_lo"]) <= float(
        summary[("heldout", ALL, "oracle")]["exact"])
    before = _agreement(out)

    # interrupted in the last prompt: its rows are partly written
    (out / "rows.jsonl").write_text("\n".join(lines[:-2]) + "\n" + lines[-2][:30])
    calls = _count_prompts(monkeypatch)
    assert main(args) == 0
    assert calls == [("heldout", 1)]  # only the prompt that had not finished
    assert len((out / "rows.jsonl").read_text().splitlines()) == 20
    assert _agreement(out) == before
    calls.clear()
    assert main(args) == 0 and calls == []  # all done: only the report is rewritten
    # other arguments, same directory: refused, nothing overwritten
    assert main([*args[:-4], "--budgets", "0.5", "--out", str(out)]) == 2
    assert len((out / "rows.jsonl").read_text().splitlines()) == 20


def test_the_generalised_plan_is_profiled_with_the_query_rule(tiny_text_checkpoints,
                                                              tmp_path):
    from vlcache.plan import Plan

    with pytest.raises(ValueError, match="query rule"):
        policy_at("vlcache-query", 0.1, 24, 300)
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(next(iter(tiny_text_checkpoints.values()))),
                 "--data", "hard", "--limit", "2", "--grid", "0.25", "--kinds", "after",
                 "--policies", "vlcache,vlcache-query", "--budgets", "0.25",
                 "--out", str(out)]) == 0
    assert Plan.load(out / "plan-query.json").rule == "query"
    assert Plan.load(out / "plan.json").rule == "first"
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    assert {r["policy"] for r in rows} == {"full", "vlcache@0.25", "vlcache-query@0.25"}
    query = [r for r in rows if r["family"] == "vlcache-query"]
    assert all(r["select_s"] > 0 for r in query)  # its relevance pass ran


@pytest.mark.parametrize("threshold", [0.0, 1e9])  # always / never escalates
def test_guard_rows_equal_guard_runs_alone(tiny_text_checkpoints, threshold):
    from vlcache.engine import Engine
    from vlcache.eval.runner import Arm, evaluate_case
    from vlcache.reuse.registry import parse_policy
    from vlcache.workloads.hard import build_cases, load_hard

    engine = Engine.from_pretrained(next(iter(tiny_text_checkpoints.values())))
    guards = [Arm("guard", r, parse_policy(f"guard:{threshold:g}:{r:g}")) for r in (0.25, 0.5)]
    queries = [Arm("query", r, parse_policy(f"query:{r:g}")) for r in (0.25, 0.5)]
    keep = ("exact", "top1", "kl", "computed", "escalated", "answer", "policy")
    for case in build_cases(load_hard(3), ("before", "multihop", "refer")):
        alone = [evaluate_case(engine, case, [g], "heldout", 0)[1] for g in guards]
        _, *shared, q25, q50 = evaluate_case(engine, case, [*guards, *queries], "heldout", 0)
        assert [a.escalated for a in alone] == [threshold == 0.0] * 2
        for a, b in zip(alone, shared, strict=True):
            assert {k: getattr(a, k) for k in keep} == pytest.approx(
                {k: getattr(b, k) for k in keep})
        # the guards' rows come from their base arms' runs (unescalated: the same time) or
        # from one escalated run (its base pass's time plus the one recompute)
        if threshold:
            assert [s.seconds for s in shared] == [q25.seconds, q50.seconds]
        else:
            assert shared[1].seconds - q50.seconds == pytest.approx(
                shared[0].seconds - q25.seconds)


def test_shards_together_give_the_whole_run(tiny_text_checkpoints, tmp_path, monkeypatch):
    model = str(next(iter(tiny_text_checkpoints.values())))
    common = ["eval", "--model", model, "--data", "hard", "--limit", "4", "--kinds",
              "before,multihop", "--policies", "naive,static", "--budgets", "0.25"]
    assert main([*common, "--out", str(tmp_path / "whole")]) == 0
    calls = _count_prompts(monkeypatch)
    sharded = [*common, "--out", str(tmp_path / "sharded")]
    assert main([*sharded, "--shard", "0/2"]) == 0
    first = list(calls)
    assert main([*sharded, "--shard", "1/2"]) == 0
    second = calls[len(first):]
    # prompts in turn (plan 0, heldout 0, plan 1, heldout 1): every other one to each shard
    assert first == [("plan", 0), ("plan", 1)] and second == [("heldout", 0), ("heldout", 1)]

    def answers(out):
        rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
        return sorted((r["split"], r["case"], r["policy"], r["answer"], r["exact"])
                      for r in rows)

    assert answers(tmp_path / "sharded") == answers(tmp_path / "whole")
    assert (tmp_path / "sharded" / "summary.md").is_file()
    with pytest.raises(SystemExit):  # K must be below N
        main([*sharded, "--shard", "2/2"])


def test_row_log_waits_for_another_process_lock(tmp_path):
    import fcntl
    import threading

    from vlcache.eval.rowlog import RowLog

    log = RowLog(tmp_path / "rows.jsonl")
    row = {"split": "plan", "case": 0, "source": "s"}
    with (tmp_path / "rows.lock").open("a") as other:  # another shard mid-write
        fcntl.flock(other, fcntl.LOCK_EX)
        writer = threading.Thread(target=log.append, args=([row],))
        writer.start()
        writer.join(0.3)
        assert writer.is_alive() and not (tmp_path / "rows.jsonl").exists()  # it waits
        fcntl.flock(other, fcntl.LOCK_UN)
        writer.join(5)
    assert not writer.is_alive()
    assert log.read({("plan", 0): (1, "s")}) == {("plan", 0): [row]}
