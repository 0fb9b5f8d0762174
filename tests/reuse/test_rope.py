"""apply_rope gives transformers' rotation (q * cos + rotate_half(q) * sin)."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from vlcache.reuse.rope import apply_rope


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_equals_transformers_rotation(dtype):
    torch.manual_seed(0)
    s, heads, d = 37, 3, 16
    x = torch.randn(s, heads, d).to(dtype)
    angles = torch.rand(s, d // 2) * 50
    emb = torch.cat([angles, angles], -1)  # [S, d], as the models build it
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    # transformers' layout: [B, heads, S, d] with cos/sin [B, S, d]
    want, _ = apply_rotary_pos_emb(x.transpose(0, 1)[None], x.transpose(0, 1)[None],
                                   cos[None], sin[None])
    got = apply_rope(x, cos, sin)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want[0].transpose(0, 1), atol=tol, rtol=tol)
    assert not torch.allclose(got, x)  # it did rotate
