"""The baseline policies of design §4 (prefix, epic, cacheblend, kvshare) in the engine."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from vlcache.engine import Engine
from vlcache.reuse.blend import CacheBlendPolicy, DeviationSchedule, KVSharePolicy
from vlcache.reuse.epic import EpicPolicy
from vlcache.reuse.policy import LayerProbe
from vlcache.reuse.prefix import PrefixPolicy
from vlcache.reuse.registry import parse_policy

CACHE = [{"role": "system", "content": "Describe images at length."}]


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="naive")


def _cached(engine: Engine, seed: int, w: int = 112, h: int = 84):
    img = random_image(seed, w, h)
    engine.prefill(CACHE + [user(img, "Describe this image.")])
    return img


def _image_counts(run) -> list[int]:
    """Image tokens computed per layer (the text's tokens are computed, but for a cached
    prefix of text in front of the images)."""
    text = run.stats.prompt_tokens - run.stats.image_tokens - run.stats.prefix_tokens_reused
    return [c - text for c in run.stats.computed_per_layer]


def test_parse_new_policy_names(tmp_path):
    assert isinstance(parse_policy("prefix"), PrefixPolicy)
    assert parse_policy("epic:16").k == 16
    cb = parse_policy("cacheblend")
    assert isinstance(cb, CacheBlendPolicy) and (cb.ratio, cb.layer) == (0.15, 1)
    cb = parse_policy("cacheblend:0.3:2")
    assert (cb.ratio, cb.layer) == (0.3, 2)
    ks = parse_policy("kvshare:0.1:1:3")
    assert isinstance(ks, KVSharePolicy) and (ks.ratio, ks.layer1, ks.layer2) == (0.1, 1, 3)
    for bad in ("epic", "epic:x", "epic:-1", "cacheblend:x", "cacheblend:2", "kvshare:0.1:a",
                "cacheblend:0.1:1:1", "prefix:3"):
        with pytest.raises(ValueError):
            parse_policy(bad)
    with pytest.raises(ValueError, match="layer 0 carries no context"):
        parse_policy("cacheblend:0.1:0").schedule(10, 4)
    with pytest.raises(ValueError, match="after the first"):
        parse_policy("kvshare:0.1:2:2").schedule(10, 4)


def test_deviation_schedule_keeps_the_highest_deviations():
    schedule = DeviationSchedule([(1, 2)])
    previous = torch.arange(5)
    assert schedule.select(0, LayerProbe(0, previous, lambda: 1 / 0)).tolist() == [0, 1, 2, 3, 4]
    dev = torch.tensor([0.1, 5.0, 0.2, 3.0, 0.0])
    assert schedule.select(1, LayerProbe(1, previous, lambda: dev)).tolist() == [1, 3]
    kept = torch.tensor([1, 3])
    assert schedule.select(2, LayerProbe(2, kept, lambda: 1 / 0)).tolist() == [1, 3]


def test_epic_computes_the_first_k_tokens_of_each_image(engine):
    a, b = _cached(engine, 40), _cached(engine, 41, 140, 140)
    run = engine.prefill([user(b, "and", a, "?")], policy="epic:3")
    assert run.stats.images_kv_reused == 2
    assert _image_counts(run) == [6] * engine.adapter.num_layers
    huge = engine.prefill([user("Now", a, "?")], policy=EpicPolicy(10_000))  # a new prefix
    n = huge.stats.image_tokens
    assert _image_counts(huge) == [n] * engine.adapter.num_layers


class _Recording(CacheBlendPolicy):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.chosen: list[list[int]] = []

    def schedule(self, num_tokens, num_layers):
        inner, chosen = super().schedule(num_tokens, num_layers), self.chosen

        class Spy(DeviationSchedule):
            def select(self, layer, probe):
                out = inner.select(layer, probe)
                chosen.append(out.tolist())
                return out

        return Spy([])


def test_cacheblend_picks_top_key_deviation_at_the_check_layer(engine):
    img = _cached(engine, 42)
    messages = [user("A different question comes first:", img, "What now?")]
    policy = _Recording(0.25, 2)
    run = engine.prefill(messages, policy=policy)
    n = run.stats.image_tokens
    layers = engine.adapter.num_layers
    k = math.ceil(0.25 * n)
    assert _image_counts(run) == [n, n] + [k] * (layers - 2)
    # layers before the check compute everything, so the fresh K there is the full run's K
    full = engine.prefill(messages, policy="full", capture=True, store_entries=False)
    exact = full.output.captured[0][0][2]  # [N, kvh, d]
    stale = engine.store.get(full.prompt.images[0].key).keys[2]
    want = torch.topk((exact - stale).pow(2).sum(dim=(1, 2)), k).indices.sort().values
    assert policy.chosen[2] == want.tolist() and policy.chosen[3] == want.tolist()


def test_cacheblend_at_ratio_one_equals_full(engine):
    img = _cached(engine, 43)
    messages = [user("Moved:", img, "Colour?")]
    full = engine.prefill(messages, policy="full")
    blend = engine.prefill(messages, policy="cacheblend:1.0:1")
    assert blend.stats.images_kv_reused == 1
    torch.testing.assert_close(blend.output.logits, full.output.logits, atol=1e-4, rtol=0)


def test_kvshare_filters_twice(engine):
    img = _cached(engine, 44, 168, 112)
    run = engine.prefill([user("Q first:", img)], policy="kvshare:0.2:1:2")
    n = run.stats.image_tokens
    first, second = math.ceil(0.4 * n), math.ceil(0.2 * n)
    assert _image_counts(run) == [n, first] + [second] * (engine.adapter.num_layers - 2)
    assert KVSharePolicy(0.2, 1, 2).mean_ratio(4) == pytest.approx((1 + 0.4 + 2 * 0.2) / 4)


def test_prefix_reuses_only_after_an_identical_prefix(engine):
    calls = [0]
    engine.adapter.visual.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    img = random_image(45)
    first = CACHE + [user("Look:", img, "Describe this image.")]
    engine.prefill(first, policy="full")
    key = engine.builder.build(first).images[0].key
    entry = engine.store.get(key)
    assert entry.context is not None and entry.context.shape == (32,)
    same_prefix = CACHE + [user("Look:", img, "A different question after it.")]
    hit = engine.prefill(same_prefix, policy="prefix")
    assert hit.stats.images_kv_reused == 1 and hit.stats.image_tokens_reused == \
        hit.stats.image_tokens
    full = engine.prefill(same_prefix, policy="full")
    torch.testing.assert_close(hit.output.logits, full.output.logits, atol=1e-4, rtol=0)
    vision_calls = calls[0]
    moved = engine.prefill([user("Look:", img, "Describe this image.")], policy="prefix")
    assert moved.stats.images_kv_reused == 0 and moved.stats.images_hit == 1
    assert calls[0] == vision_calls  # the encoder output is still reused
    torch.testing.assert_close(engine.store.get(key).keys, entry.keys)  # not overwritten


def test_prefix_digest_tells_apart_images_with_the_same_placeholders(engine):
    a, b, img = random_image(46), random_image(47), random_image(48)
    engine.prefill([user(a, img, "?")], policy="full")
    run = engine.prefill([user(b, img, "?")], policy="prefix")
    assert run.stats.images_kv_reused == 0  # same token ids before img, but another image


def test_capture_records_held_images_without_overwriting(engine):
    img = _cached(engine, 49)
    messages = [user("Elsewhere:", img, "?")]
    key = engine.builder.build(messages).images[0].key
    before = engine.store.get(key).keys.clone()
    run = engine.prefill(messages, policy="full", capture=True)
    keys, values = run.output.captured[0]
    assert keys.shape == before.shape and not torch.allclose(keys[1:], before[1:])
    torch.testing.assert_close(engine.store.get(key).keys, before)
    torch.testing.assert_close(keys[0], before[0], atol=1e-5, rtol=1e-5)  # layer 0: no context
