"""The chunked RMSNorm gives transformers' RMSNorm bit for bit, for every class it replaces."""

from __future__ import annotations

import importlib

import pytest
import torch

from vlcache.models import rms_norm
from vlcache.models.rms_norm import RMS_NORM_CLASSES, ChunkedRMSNorm, chunk_rms_norms

MODULES = {"Qwen2RMSNorm": "qwen2", "Qwen2VLRMSNorm": "qwen2_vl",
           "Qwen2_5_VLRMSNorm": "qwen2_5_vl", "Qwen3RMSNorm": "qwen3",
           "Qwen3VLTextRMSNorm": "qwen3_vl", "LlamaRMSNorm": "llama"}


def _norm_class(name: str) -> type:
    return getattr(importlib.import_module(f"transformers.models.{MODULES[name]}.modeling_"
                                           f"{MODULES[name]}"), name)


def test_every_replaced_class_is_checked():
    assert set(MODULES) == RMS_NORM_CLASSES


@pytest.mark.parametrize("name", sorted(RMS_NORM_CLASSES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7, 64), (1000, 64), (3, 400, 64), (300, 5, 64)])
def test_bit_identical_to_the_module(name, dtype, shape, monkeypatch):
    monkeypatch.setattr(rms_norm, "CHUNK_ELEMENTS", 64 * 128)  # 128 rows a chunk: many chunks
    torch.manual_seed(0)
    norm = _norm_class(name)(64, eps=1e-5).to(dtype)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = (torch.randn(*shape) * 3).to(dtype)
    want = norm(x)
    got = ChunkedRMSNorm(norm)(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


def test_swap_keeps_the_weights_and_replaces_only_rms_norms():
    norm_cls = _norm_class("Qwen2RMSNorm")
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), norm_cls(8),
                                torch.nn.Sequential(norm_cls(8), torch.nn.LayerNorm(8)))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert chunk_rms_norms(model) == 2
    assert isinstance(model[1], ChunkedRMSNorm) and isinstance(model[2][0], ChunkedRMSNorm)
    assert type(model[2][1]) is torch.nn.LayerNorm
    after = model.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert chunk_rms_norms(model) == 0  # already swapped
