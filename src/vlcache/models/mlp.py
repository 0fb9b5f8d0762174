"""Gated MLPs (down(act(gate(x)) * up(x))) with fewer passes over their [rows, intermediate]
tensors, for the decoder and for Qwen2.5-VL's vision tower.

The activation and the product are done in place, or, in fp32 on the CPU where vlcache's
kernels are built, by one `silu_mul` pass (1.5x faster than PyTorch's two at 284 rows;
`benchmarks/cpu_kernels.py`). Where gate and up are one weight (`fused_gate_up`: the decoder's
packed copy, models/packing.py, or a `StackedLinear`), they are one matmul whose result holds
both as views.

Qwen2.5-VL's vision blocks run their MLP over every patch (4,096 for a 1,024-token image) in
transformers' own forward: two matmuls with biases, an activation and a product, each writing a
fresh [patches, intermediate] tensor, and each bias is first copied into the matmul's output
(PyTorch's `addmm`: 45 ms of a 126 ms gate/up product over 16,384 patches). `fuse_vision_mlps`
swaps each for a `StackedGatedMLP`: one matmul for gate and up without biases, and one
`silu_mul` pass that adds them: the same products and sums, in another order at most (fp32
rounding).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vlcache.kernels import cpu_kernels, usable

SILU_CLASSES = {"SiLU", "SiLUActivation"}  # torch's and transformers' (F.silu in both)


def is_gated(mlp: torch.nn.Module) -> bool:
    """Whether `mlp` has the gated layout: gate/up/down projections and an activation."""
    return all(getattr(mlp, n, None) is not None
               for n in ("gate_proj", "up_proj", "down_proj", "act_fn"))


def gated_mlp(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:  # [c, H] -> [c, H]
    """`mlp`'s gated MLP as the model computes it (it has `down_proj`, `act_fn`, and
    `gate_proj` / `up_proj` or a `fused_gate_up`)."""
    act, down = mlp.act_fn, mlp.down_proj
    silu = type(act).__name__ in SILU_CLASSES
    fused = getattr(mlp, "fused_gate_up", None)
    if isinstance(fused, StackedLinear) and silu and usable(x):
        # the biases go in with the activation: no [c, 2I] copy of them under the product
        g, u = fused(x, with_bias=False)  # views of one [c, 2I] result
        a = g.new_empty(g.shape)  # [c, I]
        cpu_kernels().silu_mul(g, u, a, *fused.bias_parts())  # type: ignore[union-attr]
        return down(a)
    if fused is not None:
        g, u = fused(x)  # views of one [c, 2I] result
        if silu and usable(g):
            a = g.new_empty(g.shape)  # [c, I]
            cpu_kernels().silu_mul(g, u, a)  # type: ignore[union-attr]
            return down(a)
        a = F.silu(g) if silu else act(g)  # [c, I], contiguous
        return down(a.mul_(u))
    a = mlp.gate_proj(x)  # [c, I]
    if silu and usable(a):
        cpu_kernels().silu_mul(a, mlp.up_proj(x), a)  # type: ignore[union-attr]
        return down(a)
    a = F.silu(a, inplace=True) if silu else act(a)
    return down(a.mul_(mlp.up_proj(x)))


class StackedLinear(torch.nn.Module):
    """Linear projections of one input as one plain weight (stacked on the output dimension):
    -> each projection's output, as views of one result."""

    def __init__(self, linears: list[torch.nn.Linear]) -> None:
        super().__init__()
        if len({m.in_features for m in linears}) != 1:
            raise ValueError("stacked projections must share their input size")
        self.sizes = [m.out_features for m in linears]
        weight = torch.cat([m.weight.detach() for m in linears])  # [sum(out), in]
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        bias = None
        if any(m.bias is not None for m in linears):
            bias = torch.cat([m.bias.detach() if m.bias is not None
                              else weight.new_zeros(m.out_features) for m in linears])
            bias = torch.nn.Parameter(bias, requires_grad=False)
        self.bias = bias

    def forward(self, x: torch.Tensor, with_bias: bool = True
                ) -> tuple[torch.Tensor, ...]:  # [..., in] -> [..., out_i]
        """`with_bias=False`: the products only; the caller adds `bias_parts()`."""
        bias = self.bias if with_bias else None
        return F.linear(x, self.weight, bias).split(self.sizes, dim=-1)

    def bias_parts(self) -> tuple[torch.Tensor | None, ...]:  # ([out_i] or None) each
        if self.bias is None:
            return (None,) * len(self.sizes)
        return tuple(self.bias.split(self.sizes))


class StackedGatedMLP(torch.nn.Module):
    """A gated MLP with gate and up stacked into one weight (the originals dropped)."""

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        self.fused_gate_up = StackedLinear([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.act_fn = mlp.act_fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        shape = x.shape
        return gated_mlp(self, x.reshape(-1, shape[-1])).reshape(shape)


def fuse_vision_mlps(visual: torch.nn.Module) -> int:
    """Swap each vision block's gated MLP (plain `nn.Linear` projections) for a
    `StackedGatedMLP`; -> how many were swapped (0 for towers with ungated MLPs: Qwen2-VL,
    Qwen3-VL)."""
    count = 0
    for block in getattr(visual, "blocks", []):
        mlp = getattr(block, "mlp", None)
        if (mlp is not None and is_gated(mlp)
                and all(type(getattr(mlp, n)) is torch.nn.Linear
                        for n in ("gate_proj", "up_proj", "down_proj"))):
            block.mlp = StackedGatedMLP(mlp)
            count += 1
    return count
