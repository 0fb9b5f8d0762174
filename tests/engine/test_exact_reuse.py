"""Behind an identical prefix a cached segment is exact: every policy reuses it with nothing
recomputed, and the answer is the full recompute's to the last bit of fp32 noise."""

from __future__ import annotations

import pytest

from tests.conftest import ARCHS, random_image, user
from vlcache.engine import Engine


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="static:0.25")


def _recomputed(run) -> list[int]:
    text = run.stats.prompt_tokens - run.stats.image_tokens
    return [c - text for c in run.stats.computed_per_layer]


@pytest.mark.parametrize("policy", ["static:0.25", "query:0.25", "guard:0", "prefix"])
def test_the_same_prompt_again_recomputes_nothing_and_equals_full(engine, policy):
    img = random_image(70)
    messages = [{"role": "system", "content": "Be brief."}, user(img, "What is this?")]
    first = engine.prefill(messages, policy="full")
    again = engine.prefill(messages, policy=policy, store_entries=False)
    assert again.stats.images_kv_reused == 1 and again.stats.segments_exact == 1
    assert _recomputed(again) == [0] * engine.num_layers
    assert not again.stats.escalated
    assert (again.output.logits - first.output.logits).abs().max().item() < 1e-4


def test_a_moved_image_is_not_exact(engine):
    img = random_image(71)
    engine.prefill([user(img, "What is this?")], policy="full")
    moved = engine.prefill([{"role": "system", "content": "Other."}, user("Look:", img)],
                           store_entries=False)
    assert moved.stats.images_kv_reused == 1 and moved.stats.segments_exact == 0
    assert max(_recomputed(moved)) > 0


def test_kv_computed_behind_an_approximate_segment_is_never_exact(engine):
    a, b = random_image(72), random_image(73, 140, 112)
    engine.prefill([user(a, "Describe this image.")], policy="full")  # a cached elsewhere
    messages = [user("First", a, "then", b, "?")]
    first = engine.prefill(messages)  # a reused at 25%: b is computed behind an approximation
    assert first.stats.images_kv_reused == 1 and first.stats.images_missed == 1
    again = engine.prefill(messages, store_entries=False)
    assert again.stats.images_kv_reused == 2 and again.stats.segments_exact == 0
