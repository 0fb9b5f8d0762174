"""Packed decoder weights (the CPU default: oneDNN's layout, and MKL's in `dual`) change
rounding only: the engine with them equals plain transformers with PyTorch's own matmuls, in
every packing, which can be turned off."""

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
    can_pack_mkl,
    pack_decoder_layers,
)

pytestmark = pytest.mark.skipif(not can_pack("cpu", torch.float32),
                                reason="this PyTorch build cannot pack weights for oneDNN")


def _decoder_linears(engine: Engine) -> list[torch.nn.Module]:
    return [m for layer in engine.adapter.layers for m in layer.modules()
            if isinstance(m, (torch.nn.Linear, PackedLinear))]


def _without_mkl(monkeypatch) -> None:
    """Packing as where MKL's packed sgemm is missing (another BLAS, the kernels off)."""
    monkeypatch.setattr(packing_module, "can_pack_mkl", lambda dtype: False)


@pytest.mark.parametrize("mode", ["dual", "dual-plain", "packed"])
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_engine_equals_plain_transformers_at_a_moved_image(arch, mode, tiny_checkpoints,
                                                                   monkeypatch):
    # dual: the tiny prompts' prefills (~60 rows) take the outer weights (MKL-packed, or plain
    # in dual-plain), the recomputed rows of a hit (2..15) oneDNN's
    monkeypatch.setattr(packing_module, "MKL_ROWS", 16)
    monkeypatch.setattr(packing_module, "PLAIN_ROWS", 16)
    mkl = mode == "dual" and can_pack_mkl(torch.float32)
    if mode == "dual-plain":
        _without_mkl(monkeypatch)
    dual = mode != "packed"
    packed = Engine.from_pretrained(tiny_checkpoints[arch], policy="static:1.0",
                                    packing="dual" if dual else mode)
    plain = Engine.from_pretrained(tiny_checkpoints[arch], policy="static:1.0", packing="off")
    assert packed.packing == ("dual" if dual else mode) and plain.packing == "off"
    for layer in packed.adapter.layers:  # q/k/v and gate/up fused, the rest packed alone
        attn, mlp = layer.self_attn, layer.mlp
        assert type(attn.fused_qkv) is FusedPackedLinear
        assert type(mlp.fused_gate_up) is FusedPackedLinear
        members = [attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj]
        assert all(type(m) is FusedSlice for m in members)  # slices of the fused weight
        for m in (attn.fused_qkv, attn.o_proj, mlp.fused_gate_up, mlp.down_proj):
            assert type(m) in (PackedLinear, FusedPackedLinear)
            assert (m.outer is not None) == dual
            if dual:  # MKL's packed copy where it can be made, else the plain weight
                assert (m.outer.mkl is not None, m.outer.weight is not None) == (mkl, not mkl)
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


@pytest.mark.parametrize("mkl", [True, False])
def test_dual_sends_one_row_and_many_to_the_outer_weight(mkl, monkeypatch):
    if mkl and not can_pack_mkl(torch.float32):
        pytest.skip("MKL's packed sgemm is not available here")
    if not mkl:
        _without_mkl(monkeypatch)
    monkeypatch.setattr(packing_module, "MKL_ROWS", 3)
    monkeypatch.setattr(packing_module, "PLAIN_ROWS", 3)
    lin = torch.nn.Linear(8, 4)
    layer = PackedLinear(lin, dual=True)
    assert (layer.outer.mkl is not None) == mkl and layer.outer.from_rows == 3
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
    x = torch.randn(2, 5, 8)  # leading dimensions: 10 rows
    torch.testing.assert_close(layer(x), lin(x), atol=1e-6, rtol=1e-6)
    assert calls == [2]  # 1, 3, 7 and 10 rows: the outer weight


@pytest.mark.parametrize("dual", [False, True])
def test_fused_projections_equal_their_members(dual):
    torch.manual_seed(0)
    layer = torch.nn.Module()
    layer.self_attn = torch.nn.Module()
    for name, out, bias in (("q_proj", 8, True), ("k_proj", 4, True), ("v_proj", 4, False)):
        setattr(layer.self_attn, name, torch.nn.Linear(8, out, bias=bias))
    layer.self_attn.o_proj = torch.nn.Linear(8, 8)
    before = {n: getattr(layer.self_attn, n) for n in ("q_proj", "k_proj", "v_proj")}
    assert pack_decoder_layers(torch.nn.ModuleList([layer]), dual) == 2  # fused + o_proj
    fused = layer.self_attn.fused_qkv
    assert fused.sizes == [8, 4, 4] and (fused.outer is not None) == dual
    for rows in (1, 2, 5, 300):  # 1 and 300: the outer weight in dual
        x = torch.randn(rows, 8)
        parts = fused(x)
        for part, (name, lin) in zip(parts, before.items(), strict=True):
            torch.testing.assert_close(part, lin(x), atol=1e-5, rtol=1e-5)
            member = getattr(layer.self_attn, name)  # what transformers' forward calls
            assert type(member) is FusedSlice
            torch.testing.assert_close(member(x), lin(x), atol=1e-5, rtol=1e-5)
