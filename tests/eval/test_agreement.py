"""Teacher-forced agreement: the same verdict as comparing greedy answers, in one pass."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import random_image, user
from vlcache.engine import Engine
from vlcache.eval.agreement import agree, agree_all, words_done
from vlcache.eval.runner import greedy
from vlcache.reuse.decode import decode_step, forced_logits


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    engine = Engine.from_pretrained(tiny_checkpoints["qwen2_5_vl"])
    engine.stop_ids = set()  # a random model may end at any time; make it talk
    return engine


def _prompt(seed: int, first: int = 60) -> list[dict]:
    return [user(random_image(first), "Look:", random_image(seed), "Say something.")]


def test_forced_logits_equal_step_by_step_decoding(engine):
    messages = _prompt(1)
    tokens = [5, 17, 3, 99]
    stepped = engine.prefill(messages, policy="full", max_new_tokens=8)
    position = int(stepped.positions.max()) + 1
    with torch.inference_mode():
        steps = torch.stack([decode_step(engine.adapter, stepped.output.cache, t, position + i)
                             for i, t in enumerate(tokens)])
    caches = [engine.prefill(messages, policy=p, max_new_tokens=8).output.cache
              for p in ("full", "full", "static:0.5")]
    with torch.inference_mode():
        batch = forced_logits(engine.adapter, caches, tokens, position)  # [3, t, V]
    assert all(c.length == stepped.output.cache.length for c in caches)
    torch.testing.assert_close(batch[0], steps, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(batch[1], steps, rtol=1e-4, atol=1e-4)
    alone = engine.prefill(messages, policy="static:0.5", max_new_tokens=8).output.cache
    with torch.inference_mode():  # each arm attends to its own cache only
        torch.testing.assert_close(batch[2], forced_logits(engine.adapter, [alone], tokens,
                                                           position)[0], rtol=1e-4, atol=1e-4)


def test_agree_on_own_answer_and_on_a_changed_one(engine):
    messages = _prompt(2)
    free = greedy(engine, engine.prefill(messages, policy="full", max_new_tokens=16), 16)
    assert len(free) == 16

    def check(reference: list[int]):
        return agree(engine, engine.prefill(messages, policy="full", max_new_tokens=16),
                     reference, 16)

    same = check(free)
    assert same.exact and same.tokens == free
    wrong = list(free)
    wrong[3] = free[3] - 1 if free[3] else 1
    changed = check(wrong)
    assert not changed.exact and changed.tokens == free[:4]  # up to its own 4th token
    # full stopped after 5 tokens where this arm goes on: not the same answer
    assert not check(free[:5]).exact


def test_a_stop_after_the_reference_agrees(engine):
    messages = _prompt(3)
    free = greedy(engine, engine.prefill(messages, policy="full", max_new_tokens=16), 16)
    k = next(i for i in range(1, 16) if free[i] not in free[:i])
    engine.stop_ids = {free[k]}
    try:
        run = engine.prefill(messages, policy="full", max_new_tokens=16)
        assert greedy(engine, run, 16) == free[:k]
        run = engine.prefill(messages, policy="full", max_new_tokens=16)
        assert agree(engine, run, free[:k], 16).exact
    finally:
        engine.stop_ids = set()


@pytest.mark.parametrize("policy", ["naive", "static:0.25", "query:0.25", "static:1.0"])
def test_agree_matches_greedy_comparison(engine, policy):
    verdicts = []
    for seed in range(4, 8):
        messages = _prompt(seed, first=seed + 30)
        for image in (random_image(seed + 30), random_image(seed)):  # each cached elsewhere
            engine.prefill([user("Some other context before it.", image)], policy="full")
        full = greedy(engine, engine.prefill(messages, policy="full", max_new_tokens=16,
                                             store_entries=False), 16)
        arm = engine.prefill(messages, policy=policy, max_new_tokens=16, store_entries=False)
        own = greedy(engine, arm, 16)
        arm = engine.prefill(messages, policy=policy, max_new_tokens=16, store_entries=False)
        verdict = agree(engine, arm, full, 16, answer_words=1)
        again = engine.prefill(messages, policy=policy, max_new_tokens=16, store_entries=False)
        naive = engine.prefill(messages, policy="naive", max_new_tokens=16, store_entries=False)
        assert agree_all(engine, [again, naive], full, 16, answer_words=1)[0] == verdict
        assert verdict.exact == (own == full)
        if not verdict.exact:  # the arm's own answer, up to where it is decided
            assert own[:len(verdict.tokens)] == verdict.tokens
        verdicts.append(verdict.exact)
    # every image was cached in another context: only a full recompute keeps the answers
    assert all(verdicts) == (policy == "static:1.0")


def test_words_done():
    assert not words_done("14", 1) and words_done("14.", 1) and words_done(" red ", 1)
    assert not words_done("red ", 2) and words_done("red fox,", 2)
