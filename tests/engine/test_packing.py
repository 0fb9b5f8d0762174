"""oneDNN-packed decoder weights (the CPU default) change rounding only: the engine with them
equals plain transformers with PyTorch's own matmuls, and the choice can be turned off."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from tests.engine.helpers import hf_greedy, hf_logits
from vlcache.engine import Engine
from vlcache.models.packing import PackedLinear, can_pack

pytestmark = pytest.mark.skipif(not can_pack("cpu", torch.float32),
                                reason="this PyTorch build cannot pack weights for oneDNN")


def _decoder_linears(engine: Engine) -> list[torch.nn.Module]:
    return [m for layer in engine.adapter.layers for m in layer.modules()
            if isinstance(m, (torch.nn.Linear, PackedLinear))]


@pytest.mark.parametrize("arch", ARCHS)
def test_packed_engine_equals_plain_transformers_at_a_moved_image(arch, tiny_checkpoints):
    packed = Engine.from_pretrained(tiny_checkpoints[arch], policy="static:1.0")
    plain = Engine.from_pretrained(tiny_checkpoints[arch], policy="static:1.0", packed=False)
    assert packed.packed and not plain.packed
    assert all(type(m) is PackedLinear for m in _decoder_linears(packed))
    assert all(type(m) is torch.nn.Linear for m in _decoder_linears(plain))
    assert type(packed.adapter.lm_head) is torch.nn.Linear  # one row a step: left as it is

    img = random_image(4)
    messages = [{"role": "system", "content": "Answer in one word."},
                user("Some words first, then the picture:", img, "Colour?")]
    for engine in (packed, plain):
        engine.prefill([user(img, "Describe this image.")])  # cache it elsewhere first
    run = packed.prefill(messages, keep_hidden=True)
    assert run.stats.images_kv_reused == 1
    logits = packed.adapter.logits(run.output.final_hidden)
    torch.testing.assert_close(logits, hf_logits(plain, run.prompt), atol=1e-4, rtol=0)
    got = packed.generate(messages, max_tokens=6, store_entries=False).token_ids
    assert got and got == hf_greedy(plain, run.prompt, len(got))


def test_packing_refused_where_it_cannot_run(tiny_checkpoints):
    with pytest.raises(ValueError, match="packed weights need"):
        Engine.from_pretrained(tiny_checkpoints[ARCHS[0]], dtype=torch.float16, packed=True)
    engine = Engine.from_pretrained(tiny_checkpoints[ARCHS[0]], dtype=torch.float16)
    assert not engine.packed  # the default packs only where it can
