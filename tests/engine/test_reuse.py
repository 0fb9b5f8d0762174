"""What a hit reuses and what it computes (design §2): vision tower skipped, KV re-rotated."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from vlcache.engine import Engine
from vlcache.reuse.rope import apply_rope


@pytest.fixture(params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="naive")


def _count_vision_calls(engine: Engine) -> list[int]:
    calls = [0]
    engine.adapter.visual.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_hit_never_calls_the_vision_tower(engine):
    calls = _count_vision_calls(engine)
    img = random_image(10)
    first = engine.prefill([user(img, "Describe this image.")])
    assert calls[0] == 1 and first.stats.images_missed == 1
    for policy in ("naive", "static:0.5", "static:1.0", "encoder"):
        run = engine.prefill([user("Elsewhere:", img, "?")], policy=policy)
        assert run.stats.images_hit == 1 and run.stats.vision_s == 0.0
    assert calls[0] == 1
    engine.prefill([user("Elsewhere:", img, "?")], policy="full")
    assert calls[0] == 2  # full never reads the cache


def test_layer0_cached_keys_rotated_equal_keys_computed_at_new_positions(engine):
    img = random_image(11)
    engine.prefill([user(img, "Describe this image.")])
    entry_key = engine.builder.build([user(img)]).images[0].key
    entry = engine.store.get(entry_key)
    messages = [{"role": "system", "content": "Be brief."}, user("Moved far along:", img, "?")]
    run = engine.prefill(messages, policy="full")  # computes layer-0 K directly here
    im = run.prompt.images[0]
    rows = slice(im.start, im.start + im.num_tokens)
    cos, sin = engine.adapter.rope_tables(run.positions[:, rows])
    rotated = apply_rope(entry.keys[0], cos, sin)  # [N, kvh, d]
    direct = run.output.cache.keys[0][:, rows].transpose(0, 1)
    assert not torch.allclose(entry.positions, run.positions[:, rows])
    torch.testing.assert_close(rotated, direct, atol=1e-5, rtol=1e-5)


def test_naive_computes_no_image_token_and_uses_rotated_cached_kv(engine):
    img = random_image(12)
    engine.prefill([user(img, "Describe this image.")])
    entry = engine.store.get(engine.builder.build([user(img)]).images[0].key)
    run = engine.prefill([user("Some words first,", img, "and after.")])
    im = run.prompt.images[0]
    text_tokens = run.stats.prompt_tokens - im.num_tokens
    assert run.stats.computed_per_layer == [text_tokens] * engine.adapter.num_layers
    assert run.stats.image_tokens_reused == im.num_tokens
    rows = slice(im.start, im.start + im.num_tokens)
    cos, sin = engine.adapter.rope_tables(run.positions[:, rows])
    for layer in range(engine.adapter.num_layers):
        keys = run.output.cache.keys[layer][:, rows].transpose(0, 1)
        values = run.output.cache.values[layer][:, rows].transpose(0, 1)
        torch.testing.assert_close(keys, apply_rope(entry.keys[layer], cos, sin))
        torch.testing.assert_close(values, entry.values[layer])


@pytest.mark.parametrize("ratio", [0.05, 0.3])
def test_static_ratio_computes_the_first_tokens_of_each_image(engine, ratio):
    a, b = random_image(13), random_image(14, 140, 140)
    engine.prefill([user(a, b, "cache both")])
    run = engine.prefill([user(b, "then", a)], policy=f"static:{ratio}")
    n = [im.num_tokens for im in run.prompt.images]
    text = run.stats.prompt_tokens - sum(n)
    # the template's text before the first image was cached in front of `a`: reused exactly
    assert run.stats.prefix_tokens_reused == run.prompt.images[0].start
    want = text - run.prompt.images[0].start + sum(math.ceil(ratio * x) for x in n)
    assert run.stats.computed_per_layer == [want] * engine.adapter.num_layers
    assert run.stats.images_kv_reused == 2


def test_same_image_twice_in_one_request(engine):
    img = random_image(15)
    calls = _count_vision_calls(engine)
    first = engine.prefill([user(img, "and again", img)])
    assert calls[0] == 1 and first.stats.images_missed == 1  # encoded once
    assert first.stats.images == 2 and first.stats.images_hit == 0
    assert len([k for k in engine.store.keys() if not k.startswith("block-")]) == 1  # one image
    second = engine.prefill([user("twice:", img, img)])
    assert second.stats.images_kv_reused == 2 and calls[0] == 1


def test_full_policy_does_not_overwrite_a_cached_entry(engine):
    img = random_image(16)
    engine.prefill([user(img, "Describe this image.")])
    key = engine.builder.build([user(img)]).images[0].key
    before = engine.store.get(key).keys.clone()
    engine.prefill([user("other context", img)], policy="full")
    torch.testing.assert_close(engine.store.get(key).keys, before)


def test_multi_turn_conversation_reuses_the_image(engine):
    img = random_image(17)
    turn1 = [user(img, "What is this?")]
    answer = engine.generate(turn1, max_tokens=4).text
    turn2 = turn1 + [{"role": "assistant", "content": answer}, user("And its colour?")]
    result = engine.generate(turn2, max_tokens=4)
    # the first turn is the second's prefix: served by the block prefix cache, image included
    assert result.stats.images_hit == 1 and result.stats.images_missed == 0
    image = engine.prepare(turn1).images[0]
    assert result.stats.prefix_tokens_reused >= image.start + image.num_tokens
