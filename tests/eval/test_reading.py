"""The synthetic reading set (documents instead of images) and the commands on a text model."""

from __future__ import annotations

import csv

import pytest

from vlcache.cli import main
from vlcache.engine import Engine
from vlcache.eval.cases import prime, split_examples
from vlcache.eval.datasets import load_examples
from vlcache.eval.reading import KINDS, build_cases, load_reading, make_case, make_example
from vlcache.planner.profile import probe_inputs


def _documents(messages: list[dict]) -> list[str]:
    return [p["text"] for m in messages if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "document"]


def test_examples_are_seeded_and_answer_is_in_one_document():
    assert make_example(7, 3) == make_example(7, 3)
    assert make_example(7, 3) != make_example(8, 3)
    for ex in load_reading(40):
        assert 3 <= len(ex.docs) <= 4
        holders = [d for d in ex.docs if ex.answer in d.named]
        assert ex.docs[ex.target] in holders
        assert ex.docs[ex.target].subject.split()[-1] in ex.fact.question


@pytest.mark.parametrize("kind", KINDS)
def test_cases_cache_each_document_alone_and_reorder(kind):
    ex = make_example(7, 5)
    case = make_case(kind, ex)
    assert case == make_case(kind, ex)  # deterministic across processes (no hash())
    docs = _documents(case.messages)
    assert len(docs) == len(ex.docs) == len(case.cache_messages)
    for text, cache in zip(docs, case.cache_messages, strict=True):
        assert _documents(cache) == [text]  # cached alone
        assert cache[0]["content"] != case.messages[0]["content"]  # another system prompt
    question = case.messages[-1]["content"]
    first_text = question[0]["text"]
    assert ("Question:" in first_text) == (kind == "before")
    if kind == "refer":
        target = ex.docs[ex.target]
        assert docs[1] == target.anaphoric and target.subject not in docs[1]
        assert docs[0].endswith(f"Visitors often ask about {target.subject}.")
    else:
        assert sorted(docs) == sorted(d.named for d in ex.docs)


def test_reading_is_a_data_set_and_splits_by_example():
    examples = load_examples("reading", 6)
    assert examples == load_reading(6) and load_examples("reading:3", 2) == load_reading(2, 3)
    first, second = split_examples(examples)
    assert len(first) == len(second) == 3
    assert {e.group for e in first}.isdisjoint({e.group for e in second})
    with pytest.raises(ValueError, match="seed"):
        load_examples("reading:x", 2)
    with pytest.raises(ValueError, match="kind"):
        build_cases(examples, ("single",))


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
