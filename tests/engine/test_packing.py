"""oneDNN-packed decoder weights (the CPU default) change rounding only: the engine with them
equals plain transformers with PyTorch's own matmuls, in every packing, which can be turned
off."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from tests.engine.helpers import hf_greedy, hf_logits
from vlcache.engine import Engine
from vlcache.models import packing as packing_module
from vlcache.models.packing import (
    FusedPackedLinear,
    FusedSlice,
    PackedLinear,
    can_pack,
    pack_decoder_layers,
)

pytestmark = pytest.mark.skipif(not can_pack("cpu", torch.float32),
                                reason="this PyTorch build cannot pack weights for oneDNN")


def _decoder_linears(engine: Engine) -> list[torch.nn.Module]:
    return [m for layer in engine.adapter.layers for m in layer.modules()
            if isinstance(m, (torch.nn.Linear, PackedLinear))]


@pytest.mark.parametrize("mode", ["dual", "packed"])
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_engine_equals_plain_transformers_at_a_moved_image(arch, mode, tiny_checkpoints,
                                                                   monkeypatch):
    # dual: the tiny prompts' prefills (~60 rows) take the plain weights, the recomputed rows
    # of a hit (2..15) the packed ones
    monkeypatch.setattr(packing_module, "PLAIN_ROWS", 16)
    packed = Engine.from_pretrained(tiny_checkpoints[arch], policy="static:1.0", packing=mode)
    plain = Engine.from_pretrained(tiny_checkpoints[arch], policy="static:1.0", packing="off")
    assert packed.packing == mode and plain.packing == "off"
    for layer in packed.adapter.layers:  # q/k/v and gate/up fused, the rest packed alone
        attn, mlp = layer.self_attn, layer.mlp
        assert type(attn.fused_qkv) is FusedPackedLinear
        assert type(mlp.fused_gate_up) is FusedPackedLinear
        members = [attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj]
        # dual: the members keep their plain weights; packed: they are slices of the fused one
        assert all(type(m) is (torch.nn.Linear if mode == "dual" else FusedSlice)
                   for m in members)
        for m in (attn.o_proj, mlp.down_proj):
            assert type(m) is PackedLinear and (m.weight is not None) == (mode == "dual")
    assert all(type(m) is torch.nn.Linear for m in _decoder_linears(plain))
    assert not hasattr(plain.adapter.layers[0].self_attn, "fused_qkv")
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


def test_default_packing_and_refusals(tiny_checkpoints):
    path = tiny_checkpoints[ARCHS[0]]
    assert Engine.from_pretrained(path).packing == "dual"  # fp32 on the CPU
    for mode in ("dual", "packed"):
        with pytest.raises(ValueError, match="needs the CPU, fp32 or bf16"):
            Engine.from_pretrained(path, dtype=torch.float16, packing=mode)
    assert Engine.from_pretrained(path, dtype=torch.float16).packing == "off"  # auto: where it can
    with pytest.raises(ValueError, match="one of auto, dual, packed, off"):
        Engine.from_pretrained(path, packing="fast")


def test_dual_sends_many_rows_to_the_plain_weight(monkeypatch):
    lin = torch.nn.Linear(8, 4)
    layer = PackedLinear(lin, plain_rows=3)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Ops:  # torch.ops.mkldnn with the packed matmul spied on
        def __getattr__(self, name):
            if name == "_linear_pointwise":
                return lambda *a: calls.append(a[0].shape[0]) or real(*a)
            return getattr(torch.ops.mkldnn, name)

    monkeypatch.setattr(packing_module, "mkldnn", Ops())
    for rows in (1, 2, 3, 7):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(layer(x), lin(x), atol=1e-6, rtol=1e-6)
    assert calls == [2]  # 1, 3 and 7 rows: the plain weight


@pytest.mark.parametrize("plain_rows", [None, 3])
def test_fused_projections_equal_their_members(plain_rows):
    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.self_attn = torch.nn.Module()
    for name, out, bias in (("q_proj", 8, True), ("k_proj", 4, True), ("v_proj", 4, False)):
        setattr(layer.self_attn, name, torch.nn.Linear(8, out, bias=bias))
    layer.self_attn.o_proj = torch.nn.Linear(8, 8)
    before = {n: getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj")}
    assert pack_decoder_layers(torch.nn.ModuleList([layer]), plain_rows) == 2  # fused + o_proj
    fused = layer.self_attn.fused_qkv
    assert fused.sizes == [8, 4, 4]
    assert [fused.takes(r) for r in (1, 2, 3)] == ([True] * 3 if plain_rows is None
                                                   else [False, True, False])
    for rows in (1, 2, 5):
        x = torch.randn(rows, 8)
        parts = fused(x)
        for part, (name, lin) in zip(parts, before.items(), strict=True):
            torch.testing.assert_close(part, lin(x), atol=1e-6, rtol=1e-6)
            member = getattr(layer.self_attn, name)  # what transformers' forward calls
            assert (member is lin) == (plain_rows is not None)
            torch.testing.assert_close(member(x), lin(x), atol=1e-6, rtol=1e-6)
