"""The invariants of design §2: a hit recomputing everything equals a plain transformers forward."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from tests.engine.helpers import hf_greedy, hf_logits
from vlcache.engine import Engine


@pytest.fixture(params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="static:1.0")


def _all_logits(engine: Engine, messages: list[dict]) -> tuple[torch.Tensor, object]:
    run = engine.prefill(messages, keep_hidden=True)
    seq_len = run.prompt.input_ids.shape[0]
    assert run.stats.computed_per_layer == [seq_len] * engine.adapter.num_layers
    return engine.adapter.logits(run.output.final_hidden), run


def test_hit_at_new_position_equals_full_forward(engine):
    img = random_image(1)
    engine.prefill([user(img, "Describe this image.")])  # cache it at the start of a prompt
    messages = [{"role": "system", "content": "Answer in one word."},
                user("A longer preamble that moves the picture along. Here:", img, "Colour?")]
    logits, run = _all_logits(engine, messages)
    assert run.stats.images_kv_reused == 1 and run.stats.images_missed == 0
    assert run.prompt.images[0].start > 20  # it really moved
    ref = hf_logits(engine, run.prompt)
    torch.testing.assert_close(logits, ref, atol=1e-4, rtol=0)


def test_two_images_in_swapped_order_equal_full_forward(engine):
    a, b = random_image(2), random_image(3, 140, 112)
    engine.prefill([user(a, "first", b, "second")])
    logits, run = _all_logits(engine, [user("Now the other way round:", b, "then", a, "?")])
    assert run.stats.images_kv_reused == 2 and run.stats.images_hit == 2
    torch.testing.assert_close(logits, hf_logits(engine, run.prompt), atol=1e-4, rtol=0)


def test_greedy_decode_on_hit_equals_transformers_generate(engine):
    img = random_image(4)
    engine.generate([user(img, "Describe this image.")], max_tokens=2)
    messages = [user("Question about", img, "What is shown?")]
    result = engine.generate(messages, max_tokens=12)
    assert result.stats.images_kv_reused == 1
    prompt = engine.builder.build(messages)
    expected = hf_greedy(engine, prompt, 12)
    stops = engine.stop_ids
    cut = next((i for i, t in enumerate(expected) if t in stops), len(expected))
    assert result.token_ids == expected[:cut]


def test_text_only_request_equals_full_forward(engine):
    logits, run = _all_logits(engine, [user("No pictures here, only words.")])
    assert run.stats.images == 0
    torch.testing.assert_close(logits, hf_logits(engine, run.prompt), atol=1e-4, rtol=0)


def test_last_layer_runs_only_the_last_row_and_keeps_its_logits(engine, monkeypatch):
    """Without keep_hidden the last layer gives every computed row its K/V but only the last
    row its attention and MLP: the first-token logits stay the full forward's, on a miss and on
    a partial hit."""
    img = random_image(5)
    messages = [user("Look:", img, "What is shown?")]
    finished: list[int] = []  # rows through the MLP, per layer
    finish = engine.adapter.finish
    monkeypatch.setattr(engine.adapter, "finish",
                        lambda layer, x, a: finished.append(x.shape[0]) or finish(layer, x, a))
    miss = engine.prefill(messages)
    seq_len = miss.prompt.input_ids.shape[0]
    assert finished == [seq_len] * (engine.adapter.num_layers - 1) + [1]
    assert miss.stats.computed_per_layer == [seq_len] * engine.adapter.num_layers
    ref = hf_logits(engine, miss.prompt)[-1]
    torch.testing.assert_close(miss.output.logits, ref, atol=1e-4, rtol=0)
    moved = [{"role": "system", "content": "Be brief."}, user("Now:", img, "Colour?")]
    partial = engine.prefill(moved, policy="static:0.3", store_entries=False)
    kept = engine.prefill(moved, policy="static:0.3", store_entries=False, keep_hidden=True)
    assert partial.stats.images_kv_reused == 1
    assert partial.stats.computed_per_layer == kept.stats.computed_per_layer
    torch.testing.assert_close(partial.output.logits, kept.output.logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(kept.output.logits,
                               engine.adapter.logits(kept.output.final_hidden[-1:])[0])
