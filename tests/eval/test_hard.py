"""The hard-case reading set: seeded, answerable from its documents, valid prompts per kind."""

from __future__ import annotations

import re

import pytest

from vlcache.engine import Engine
from vlcache.workloads.cases import split_examples
from vlcache.workloads.datasets import load_examples
from vlcache.workloads.hard import (
    CACHE_SYSTEM,
    KINDS,
    Slot,
    build_cases,
    load_hard,
    make_case,
    make_example,
)


def _documents(messages: list[dict]) -> list[str]:
    return [p["text"] for m in messages if isinstance(m["content"], list)
            for p in m["content"] if p["type"] == "document"]


def _parts(messages: list[dict]) -> list[dict]:
    return [p for m in messages if m["role"] == "user" for p in m["content"]]


@pytest.mark.parametrize("kind", KINDS)
def test_examples_are_seeded(kind):
    assert make_example(Slot(24, 5), kind) == make_example(Slot(24, 5), kind)
    assert make_example(Slot(24, 5), kind) != make_example(Slot(25, 5), kind)
    assert make_example(Slot(24, 5), kind) != make_example(Slot(24, 6), kind)


@pytest.mark.parametrize("kind", KINDS)
def test_every_fact_the_answer_needs_is_in_its_document(kind):
    for slot in load_hard(40):
        ex = make_example(slot, kind)
        assert 2 <= len(ex.docs) <= 6
        assert re.fullmatch(r"[A-Za-z0-9]+", ex.answer)  # one word or number
        for index, needs in ex.hops:
            for text in needs:
                assert text in ex.docs[index], (ex.source, text)
        assert ex.answer in ex.docs[ex.hops[-1][0]]
        if kind == "multihop":  # the answer's document is not the one the question names
            assert len({i for i, _ in ex.hops}) == len(ex.hops) >= 2
            assert ex.hops[0][1][0].split()[-1] in ex.question
            assert ex.hops[1][1][0] not in ex.question  # the bridge town is not given


def test_multihop_has_two_and_three_hop_chains():
    hops = {len(make_example(slot, "multihop").hops) for slot in load_hard(40)}
    assert hops == {2, 3}


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_builds_valid_messages(kind, tiny_text_checkpoints):
    engine = Engine.from_pretrained(next(iter(tiny_text_checkpoints.values())))
    for slot in load_hard(6):
        ex = make_example(slot, kind)
        case = make_case(ex)
        assert case.kind == kind and case.answer == ex.answer
        docs = _documents(case.messages)
        assert docs == list(ex.docs)
        assert len(engine.builder.build(case.messages).segments) == len(docs)
        texts = [p["text"] for p in _parts(case.messages)]
        asked = [i for i, p in enumerate(_parts(case.messages))
                 if p["type"] == "text" and "Question:" in p["text"]]
        assert len(asked) == 1 and ex.question in texts[asked[0]]
        doc_at = [i for i, p in enumerate(_parts(case.messages)) if p["type"] == "document"]
        if kind == "before":
            assert asked[0] < doc_at[0]
        elif kind == "between":
            assert doc_at[0] < asked[0] < doc_at[-1]
        else:
            assert asked[0] > doc_at[-1]
        if kind == "reorder":  # cached together, in another order
            (cache,) = case.cache_messages
            assert sorted(_documents(cache)) == sorted(docs) and _documents(cache) != docs
        else:  # each cached alone, under another system prompt
            assert [_documents(c) for c in case.cache_messages] == [[d] for d in docs]
        for cache in case.cache_messages:
            assert cache[0]["content"] == CACHE_SYSTEM != case.messages[0]["content"]


def test_refer_shows_the_anaphoric_document_after_its_pointer():
    for slot in load_hard(10):
        ex = make_example(slot, "refer")
        (pointer, _), (target, _) = ex.hops
        assert target == pointer + 1
        assert "that visitors ask about in the previous document" in ex.docs[target]
        subject = ex.hops[0][1][0]
        assert ex.docs[pointer].endswith(f"Visitors often ask about {subject}.")
        assert subject not in ex.docs[target]


def test_lookalike_documents_share_one_template():
    for slot in load_hard(10):
        ex = make_example(slot, "lookalike")
        shapes = {re.sub(r"\b[A-Z][a-z]+\b|\b[a-z]+\b|\d+", "w", d) for d in ex.docs}
        assert len(shapes) == 1  # the same sentences, other names and numbers
        assert len(set(ex.docs)) == len(ex.docs)


def test_documents_range_from_short_to_long():
    words = [len(d.split()) for slot in load_hard(30) for kind in KINDS
             for d in make_example(slot, kind).docs]
    assert min(words) < 40 and max(words) > 140
    assert 60 < sum(words) / len(words) < 110


def test_hard_is_a_data_set_split_by_slot_with_kinds_in_turn():
    slots = load_examples("hard", 14)
    assert slots == load_hard(14) and load_examples("hard:3", 2) == load_hard(2, 3)
    first, second = split_examples(slots)
    assert len(first) == len(second) == 7
    assert {s.group for s in first}.isdisjoint({s.group for s in second})
    for half in (first, second):
        assert [c.kind for c in build_cases(half)] == list(KINDS)
    assert build_cases(first, ("before",)) == build_cases(first, ("before",))
    with pytest.raises(ValueError, match="kind"):
        build_cases(first, ("single",))
    with pytest.raises(ValueError, match="seed"):
        load_examples("hard:x", 2)
