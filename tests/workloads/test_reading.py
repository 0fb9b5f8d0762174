"""The synthetic reading set: documents instead of images, each cached alone."""

from __future__ import annotations

import pytest

from vlcache.workloads.cases import split_examples
from vlcache.workloads.datasets import load_examples
from vlcache.workloads.reading import KINDS, build_cases, load_reading, make_case, make_example


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
