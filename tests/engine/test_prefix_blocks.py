"""The block prefix cache: a repeated prompt computes only its tail, exactly."""

from __future__ import annotations

import pytest

from tests.conftest import ARCHS, random_image, user
from vlcache.engine import Engine
from vlcache.engine.blocks import BLOCK, block_ends, block_keys
from vlcache.entry import ImageEntry

LONG = "The archive keeps every letter in order of arrival. " * 4


@pytest.fixture(params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="static:0.25")


def _ask(img, question: str, system: str = "Be brief.") -> list[dict]:
    return [{"role": "system", "content": system}, user(img, LONG, question)]


def test_the_same_prompt_again_computes_only_its_last_block(engine, monkeypatch):
    img = random_image(80)
    first = engine.prefill(_ask(img, "What is it?"))
    seq_len = first.stats.prompt_tokens
    assert seq_len > 2 * BLOCK
    calls = []
    monkeypatch.setattr(engine.adapter, "encode_images",
                        lambda *a, **k: calls.append(1))  # must not run
    again = engine.prefill(_ask(img, "What is it?"), store_entries=False)
    cached = (seq_len - 1) // BLOCK * BLOCK
    assert again.stats.prefix_tokens_reused == cached and calls == []
    assert again.stats.computed_per_layer == [seq_len - cached] * engine.num_layers
    assert again.stats.images_hit == 1 and again.stats.cached_tokens >= cached
    assert (again.output.logits - first.output.logits).abs().max().item() < 1e-4


def test_a_new_tail_behind_a_cached_prefix_equals_full(engine):
    img = random_image(81)
    engine.prefill(_ask(img, "What is it?"))
    run = engine.prefill(_ask(img, "And which colour dominates it, if any?"),
                         store_entries=False)
    full = engine.prefill(_ask(img, "And which colour dominates it, if any?"), policy="full",
                          store_entries=False)
    assert run.stats.prefix_tokens_reused >= BLOCK
    assert full.stats.prefix_tokens_reused == 0  # full never reads the cache
    assert (run.output.logits - full.output.logits).abs().max().item() < 1e-4


def test_another_system_prompt_shares_no_block(engine):
    img = random_image(82)
    engine.prefill(_ask(img, "What is it?"))
    moved = engine.prefill(_ask(img, "What is it?", system="Answer in French."),
                           store_entries=False)
    assert moved.stats.prefix_tokens_reused == 0 and moved.stats.images_kv_reused == 1


def test_blocks_behind_an_approximate_segment_are_not_stored(engine):
    img = random_image(83)
    engine.prefill([user(img, "Describe this image.")])  # cached in another context
    messages = _ask(img, "What is it?")
    first = engine.prefill(messages)  # the image is reused at 25%: not exact
    assert first.stats.images_kv_reused == 1 and first.stats.segments_exact == 0
    start = first.prompt.images[0].start
    again = engine.prefill(messages, store_entries=False)
    assert again.stats.prefix_tokens_reused == start  # the text before it is a block


def test_a_damaged_block_is_a_miss(engine):
    img = random_image(84)
    messages = _ask(img, "What is it?")
    first = engine.prefill(messages)
    keys = block_keys(first.prompt, str(engine.fingerprint), [BLOCK])
    bad = engine.cached_entry(keys[0])
    engine.store.put(keys[0], ImageEntry(keys=bad.keys[:, :3], values=bad.values[:, :3]))
    again = engine.prefill(messages, store_entries=False)
    assert again.stats.prefix_tokens_reused == 0
    assert (again.output.logits - first.output.logits).abs().max().item() < 1e-4


def test_blocks_end_every_block_rows_and_where_a_segment_starts(engine):
    img = random_image(85)
    prompt = engine.prefill(_ask(img, "What is it?"), store_entries=False).prompt
    start = prompt.images[0].start
    assert start % BLOCK  # the chat template puts the image inside a block
    ends = block_ends(prompt, 100)
    assert ends == sorted({*range(BLOCK, 101, BLOCK), start})


def test_a_known_text_in_front_of_a_new_image_is_reused(engine):
    engine.prefill(_ask(random_image(86), "What is it?"))
    messages = _ask(random_image(87), "What is it?")  # a new image behind the same text
    run = engine.prefill(messages, store_entries=False)
    start = run.prompt.images[0].start
    assert run.stats.prefix_tokens_reused == start and run.stats.images_missed == 1
    assert run.stats.computed_per_layer == [run.stats.prompt_tokens - start] * engine.num_layers
    full = engine.prefill(messages, policy="full", store_entries=False)
    assert (run.output.logits - full.output.logits).abs().max().item() < 1e-4
