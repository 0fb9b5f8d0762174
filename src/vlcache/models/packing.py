"""Decoder weights pre-packed for oneDNN on the CPU.

PyTorch's plain CPU `linear` (MKL sgemm) is slow for a few rows: a repeated prompt's tail, a
moved image's recomputed tokens or a decode step run 4–70 rows through every projection, where
MKL takes 2–3× longer than oneDNN with weights reordered once, in its own blocked layout.
For hundreds of rows both run at the core's peak (docs/bench/README.md, "Packed weights"). So the
language model's projections are packed once after loading; their results differ from MKL's by
rounding only (fp32: ~1e-6 relative; a different summation order).

Only the decoder layers' projections are packed (the vision tower runs thousands of rows, where
packing gains nothing; `lm_head` runs one row and may share the embedding's weight). A packed
weight is an opaque oneDNN tensor: fingerprint the model before packing, and do not move it to
another device afterwards.
"""

from __future__ import annotations

import torch

PACKABLE_DTYPES = (torch.float32, torch.bfloat16)


def can_pack(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether this PyTorch build can pack weights of `dtype` on `device` (the CPU only)."""
    if torch.device(device).type != "cpu" or dtype not in PACKABLE_DTYPES:
        return False
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    if not (hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")):
        return False
    return dtype != torch.bfloat16 or bool(ops._is_mkldnn_bf16_supported())


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward over a oneDNN-packed copy of its weight (the original is dropped)."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()  # [out, in]
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias,
                                                  "none", [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, packed=oneDNN")


def pack_decoder_layers(layers: torch.nn.ModuleList) -> int:
    """Replace every `nn.Linear` inside the decoder layers by a `PackedLinear`; -> how many."""
    count = 0
    for layer in layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, PackedLinear(child))
                    count += 1
    return count
