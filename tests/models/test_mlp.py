"""Gated MLPs with gate and up stacked into one weight give the model's own outputs."""

from __future__ import annotations

import pytest
import torch
from transformers import PretrainedConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLMLP

from vlcache.models import mlp as mlp_module
from vlcache.models.mlp import StackedGatedMLP, StackedLinear, fuse_vision_mlps


def _vision_mlp(act: str = "silu") -> Qwen2_5_VLMLP:
    cfg = PretrainedConfig()
    cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act = 32, 64, act
    torch.manual_seed(0)
    return Qwen2_5_VLMLP(cfg, bias=True)


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh"])
@pytest.mark.parametrize("kernels", [True, False])
def test_stacked_gated_mlp_equals_the_model_mlp(act, kernels, monkeypatch):
    if not kernels:  # PyTorch's operators instead of vlcache's silu_mul
        monkeypatch.setattr(mlp_module, "usable", lambda *t: False)
    mlp = _vision_mlp(act)
    x = torch.randn(2, 50, 32)
    with torch.inference_mode():
        want = mlp(x)
        stacked = StackedGatedMLP(mlp)
        got = stacked(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert not hasattr(stacked, "gate_proj")  # the separate weights are not kept


def test_stacked_linear_splits_one_result_and_fills_missing_biases():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 3, bias=False), torch.nn.Linear(8, 5)
    x = torch.randn(4, 8)
    ya, yb = StackedLinear([a, b])(x)
    torch.testing.assert_close(ya, a(x).detach())
    torch.testing.assert_close(yb, b(x).detach())
    with pytest.raises(ValueError, match="input size"):
        StackedLinear([a, torch.nn.Linear(9, 2)])


def test_only_gated_vision_mlps_are_swapped():
    class Block(torch.nn.Module):
        def __init__(self, mlp):
            super().__init__()
            self.mlp = mlp

    class Visual(torch.nn.Module):
        def __init__(self, mlps):
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block(m) for m in mlps)

    ungated = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(),
                                  torch.nn.Linear(64, 32))  # Qwen2-VL / Qwen3-VL style
    visual = Visual([_vision_mlp(), ungated])
    assert fuse_vision_mlps(visual) == 1
    assert isinstance(visual.blocks[0].mlp, StackedGatedMLP)
    assert visual.blocks[1].mlp is ungated
    assert fuse_vision_mlps(torch.nn.Linear(2, 2)) == 0  # no blocks at all
