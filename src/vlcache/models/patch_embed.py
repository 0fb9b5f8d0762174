"""The vision tower's patch embedding as one matmul.

Qwen-VL vision towers embed each patch (channels x frames x 14 x 14 pixels) with a `Conv3d`
whose kernel equals its stride: every output is one dot product of a whole patch with each
filter, i.e. a linear map of the flattened patch. PyTorch's CPU Conv3d takes ~10x longer than
the same matmul here (95 ms against ~10 ms for the fixture's 4,096 patches), so the engine runs
it as `linear` over the flattened patch with the filters flattened in the same (C, T, H, W)
order: the same products, summed in another order.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class PatchLinear(torch.nn.Module):
    """Stands in for a patch embedding's `Conv3d` (kernel == stride, no padding): input
    [P, C, T, ph, pw] (one kernel-sized patch each), output [P, E, 1, 1, 1] like the conv's."""

    def __init__(self, conv: torch.nn.Conv3d) -> None:
        super().__init__()
        self.kernel_size = tuple(conv.kernel_size)
        self.weight = torch.nn.Parameter(conv.weight.detach().flatten(1), requires_grad=False)
        # [E, C*T*ph*pw]
        self.bias = (None if conv.bias is None
                     else torch.nn.Parameter(conv.bias.detach(), requires_grad=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [P, C, T, ph, pw] -> [P, E, 1, 1, 1]
        if tuple(x.shape[2:]) != self.kernel_size:
            raise ValueError(f"patches of {tuple(x.shape[2:])}, expected {self.kernel_size}")
        return F.linear(x.flatten(1), self.weight, self.bias)[:, :, None, None, None]


def patch_conv_as_linear(visual: torch.nn.Module) -> bool:
    """Replace `visual.patch_embed.proj` by a `PatchLinear` where it is a Conv3d whose kernel
    equals its stride (unpadded, ungrouped); -> whether it was replaced."""
    embed = getattr(visual, "patch_embed", None)
    conv = getattr(embed, "proj", None)
    if not (isinstance(conv, torch.nn.Conv3d) and tuple(conv.kernel_size) == tuple(conv.stride)
            and all(p == 0 for p in conv.padding) and conv.groups == 1
            and all(d == 1 for d in conv.dilation)):
        return False
    embed.proj = PatchLinear(conv)
    return True
