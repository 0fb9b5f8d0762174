"""The patch embedding's Conv3d run as one matmul gives the conv's outputs (to fp32 rounding)."""

from __future__ import annotations

import pytest
import torch

from vlcache.models.patch_embed import PatchLinear, patch_conv_as_linear


@pytest.mark.parametrize("bias", [False, True])  # Qwen2/2.5-VL: no bias; Qwen3-VL: a bias
def test_patch_linear_equals_the_conv(bias):
    torch.manual_seed(0)
    conv = torch.nn.Conv3d(3, 32, kernel_size=(2, 14, 14), stride=(2, 14, 14), bias=bias)
    x = torch.randn(50, 3, 2, 14, 14)
    want = conv(x)  # [50, 32, 1, 1, 1]
    got = PatchLinear(conv)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="patches of"):
        PatchLinear(conv)(torch.randn(2, 3, 2, 28, 28))


def test_only_a_kernel_sized_stride_is_replaced():
    class Embed(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.proj = conv

    class Visual(torch.nn.Module):
        def __init__(self, conv):
            super().__init__()
            self.patch_embed = Embed(conv)

    overlapping = Visual(torch.nn.Conv3d(3, 8, kernel_size=(2, 14, 14), stride=(1, 7, 7)))
    assert not patch_conv_as_linear(overlapping)
    assert isinstance(overlapping.patch_embed.proj, torch.nn.Conv3d)
    patches = Visual(torch.nn.Conv3d(3, 8, kernel_size=(2, 14, 14), stride=(2, 14, 14)))
    assert patch_conv_as_linear(patches) and isinstance(patches.patch_embed.proj, PatchLinear)
    assert not patch_conv_as_linear(torch.nn.Linear(2, 2))  # no patch embedding at all
