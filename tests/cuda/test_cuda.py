"""The exactness invariants on a CUDA GPU, in bf16 (skipped where torch sees no GPU).

`benchmarks/gpu_check.sh` runs these on a GPU machine before its timing sweep.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from tests.engine.helpers import hf_inputs
from vlcache.engine import Engine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA GPU visible: these run on a GPU machine "
                                       "(benchmarks/gpu_check.sh)")


@pytest.fixture(params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="static:1.0",
                                  device="cuda", dtype=torch.bfloat16)


def _hf_logits(engine: Engine, prompt) -> torch.Tensor:  # [S, V]
    model = engine.model
    if hasattr(model.model, "rope_deltas"):
        model.model.rope_deltas = None
    inputs = {k: v.to("cuda") for k, v in hf_inputs(engine, prompt).items()}
    with torch.no_grad():
        return model(**inputs).logits[0].float()


def test_defaults_on_cuda(engine):
    assert engine.device.type == "cuda" and engine.dtype == torch.bfloat16


def test_moved_hit_recomputing_everything_equals_transformers(engine):
    img = random_image(1)
    engine.prefill([user(img, "Describe this image.")])
    messages = [{"role": "system", "content": "Answer in one word."},
                user("A longer preamble that moves the picture along. Here:", img, "Colour?")]
    run = engine.prefill(messages, keep_hidden=True)
    assert run.stats.images_kv_reused == 1 and run.stats.images_missed == 0
    logits = engine.adapter.logits(run.output.final_hidden)
    ref = _hf_logits(engine, run.prompt)
    torch.testing.assert_close(logits, ref, atol=5e-2, rtol=5e-2)  # bf16
    assert int(logits[-1].argmax()) == int(ref[-1].argmax())


def test_a_hit_never_runs_the_vision_tower(engine, monkeypatch):
    img = random_image(2)
    engine.prefill([user(img, "Describe this image.")])
    calls = []
    real = engine.adapter.encode_images
    monkeypatch.setattr(engine.adapter, "encode_images",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    run = engine.prefill([user("Again:", img, "What is it?")], policy="static:0.05")
    assert run.stats.images_hit == 1 and calls == []


def test_entries_are_stored_on_the_host(engine):
    img = random_image(3)
    run = engine.prefill([user(img, "Describe this image.")], policy="full")
    key = run.prompt.images[0].key
    entry = engine.cached_entry(key)
    assert entry is not None and entry.keys.device.type == "cpu"
