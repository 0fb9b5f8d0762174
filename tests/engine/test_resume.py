"""Plans that start at a middle layer resume from the hidden state the cache entry holds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from tests.engine.helpers import hf_logits
from vlcache.engine import Engine
from vlcache.plan import Plan

START = 2  # the tiny models have 4 layers


def _resume_plan(num_layers: int, ratio: float = 1.0) -> Plan:
    return Plan(tuple([0.0] * START + [ratio] * (num_layers - START)), name="resume",
                start_layer=START)


@pytest.fixture(params=ARCHS)
def checkpoint(request, tiny_checkpoints):
    return tiny_checkpoints[request.param]


def test_resuming_from_the_entrys_exact_hidden_state_equals_full_forward(checkpoint):
    # exact_hits=False: the plan applies although the prefix is the one the entry was made in
    engine = Engine.from_pretrained(checkpoint, capture_hidden_at=START, exact_hits=False)
    messages = [user("Look:", random_image(5), "What is it?")]
    miss = engine.prefill(messages)  # cached in this very context: its KV and hidden are exact
    entry = engine.store.get(miss.prompt.segments[0].key)
    assert entry.resume_layer == START and entry.hidden.shape == (entry.num_tokens,
                                                                   engine.adapter.hidden_size)
    plan = _resume_plan(engine.adapter.num_layers)
    hit = engine.prefill(messages, policy=plan, keep_hidden=True)
    n = hit.prompt.images[0].num_tokens
    assert hit.stats.images_kv_reused == 1
    assert hit.output.reused_computed == [[0] * START + [n] * (engine.adapter.num_layers - START)]
    logits = engine.adapter.logits(hit.output.final_hidden)
    torch.testing.assert_close(logits, hf_logits(engine, hit.prompt), atol=1e-4, rtol=0)

    # The layer-START tokens really start from the entry's hidden state: spoil it, and they move.
    key = miss.prompt.segments[0].key
    engine.store.put(key, dataclasses.replace(entry, hidden=torch.randn_like(entry.hidden)))
    spoilt = engine.prefill(messages, policy=plan)
    assert (spoilt.output.logits - hit.output.logits).abs().max() > 1e-2


def test_an_entry_without_that_hidden_state_falls_back_to_computing_from_layer_0(checkpoint):
    engine = Engine.from_pretrained(checkpoint, exact_hits=False)  # captures no hidden states
    messages = [user("Look:", random_image(6), "What is it?")]
    miss = engine.prefill(messages)
    assert engine.store.get(miss.prompt.segments[0].key).hidden is None
    hit = engine.prefill(messages, policy=_resume_plan(engine.adapter.num_layers, ratio=0.5))
    n = hit.prompt.images[0].num_tokens
    assert hit.output.reused_computed == [[-(-n // 2)] * engine.adapter.num_layers]


def test_an_engine_with_a_resuming_plan_captures_that_layer(checkpoint):
    probe = Engine.from_pretrained(checkpoint)
    plan = _resume_plan(probe.adapter.num_layers, ratio=0.25)
    engine = Engine.from_pretrained(checkpoint, policy=plan)
    assert engine.capture_hidden_at == START
    miss = engine.prefill([user(random_image(7), "Describe this image.")])
    assert engine.store.get(miss.prompt.segments[0].key).resume_layer == START
    with pytest.raises(ValueError, match="capture_hidden_at"):
        Engine.from_pretrained(checkpoint, capture_hidden_at=probe.adapter.num_layers)
