"""Decoder weights pre-packed on the CPU: for oneDNN, and in `dual` for MKL's sgemm too.

PyTorch's plain CPU `linear` (MKL sgemm) repacks the weight into its blocked layout on every
call. For a few rows that costs up to 2x: a repeated prompt's tail or a moved image's
recomputed tokens run 4-70 rows through every projection. So the language model's projections
are packed once after loading; their results differ from the plain matmul's by rounding only
(fp32: ~1e-5 absolute on outputs of order 1; another summation order).

Two packed layouts, each fastest somewhere (fp32, one thread, 24 layers' weights in turn,
`benchmarks/packed_linear.py --layers 24`, docs/bench/README.md "Packed weights"): oneDNN's
reordered weight for 2-25 rows, and MKL's own packed format (`cblas_sgemm_pack`, through
vlcache's CPU kernels) for 26 rows or more (9-17% faster than oneDNN's from 70 rows) and for
one row (a decode step: 6% faster than oneDNN's; the plain weight would be 6% faster still).
The fp32 default (`dual`) holds both, so the decoder's weights are held twice. Where MKL's
packing is not there (the kernels off or unbuilt, another BLAS, bf16), `dual` keeps the plain
weight instead, for one row and for 257 rows or more (oneDNN's packed matmul steps up at 257
rows). `packed` holds only oneDNN's copy (no extra memory); `off` packs nothing. For bf16 the
plain and oneDNN weights run at the same speed for many rows, so there `auto` packs for
oneDNN only.

Projections of the same input are packed as one weight (`FusedPackedLinear`: q/k/v, and the
MLP's gate/up): for a few rows the time goes to reading the weights, and one call reads them a
little faster than three or two (one layer's seven projections: 6% faster at 12 rows, 3% at
28-70, the same from 284; `benchmarks/packed_linear.py`). The members become `FusedSlice`s of
the fused weight, for code that calls one by itself (transformers' own forward).

Only the decoder layers' projections are packed (`lm_head` runs one row and may share the
embedding's weight). A packed weight is opaque and must stay where it is: fingerprint the
model before packing, and do not move or copy it afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from vlcache.kernels import cpu_kernels

mkldnn = torch.ops.mkldnn  # (a seam for the tests' spies)
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
PACKING_MODES = ("auto", "dual", "packed", "off")
MKL_ROWS = 26  # dual with MKL's packing: one row and this many or more take it, oneDNN the rest
PLAIN_ROWS = 257  # dual without it: one row and this many or more take the plain weight
MKL_ROWS_HINT = 4096  # the row count MKL packs for (its blocking: packed for 64 rows, thousands
#                       of rows ran slower); any row count may use the result


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


def can_pack_mkl(dtype: torch.dtype) -> bool:
    """Whether weights of `dtype` can be packed for MKL's sgemm here (fp32, vlcache's CPU
    kernels built, PyTorch's BLAS being MKL)."""
    kernels = cpu_kernels() if dtype == torch.float32 else None
    return kernels is not None and bool(kernels.mkl_packing())


class OuterRows(torch.nn.Module):
    """The weight `dual` gives one row and many: packed for MKL where it can be, else plain;
    `from_rows`: from how many rows on it takes over from oneDNN's copy."""

    def __init__(self, weight: torch.Tensor) -> None:  # [out, in]
        super().__init__()
        self.out_features = weight.shape[0]
        if can_pack_mkl(weight.dtype):
            packed = cpu_kernels().mkl_pack(weight.contiguous(), MKL_ROWS_HINT)  # type: ignore[union-attr]
            self.register_buffer("mkl", packed)
            self.register_buffer("weight", None)
            self.from_rows = MKL_ROWS
        else:
            self.register_buffer("mkl", None)
            self.register_buffer("weight", weight)
            self.from_rows = PLAIN_ROWS

    def takes(self, rows: int) -> bool:
        return rows == 1 or rows >= self.from_rows

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None
                ) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.mkl is None:
            return F.linear(x, self.weight, bias)
        flat = x.reshape(-1, x.shape[-1]).contiguous()  # [rows, in]
        out = cpu_kernels().mkl_linear(flat, self.mkl, self.out_features, bias)  # type: ignore[union-attr]
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"{'MKL-packed' if self.mkl is not None else 'plain'}, from_rows={self.from_rows}"


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward over a oneDNN-packed copy of its weight (the original is dropped),
    or of several projections' weights stacked on the output dimension; with `dual`, also an
    `OuterRows` copy for one row and many."""

    def __init__(self, linears: torch.nn.Linear | Sequence[torch.nn.Linear],
                 dual: bool = False) -> None:
        super().__init__()
        linears = [linears] if isinstance(linears, torch.nn.Linear) else list(linears)
        if len({m.in_features for m in linears}) != 1:
            raise ValueError("fused projections must share their input size")
        self.in_features = linears[0].in_features
        self.sizes = [m.out_features for m in linears]
        self.out_features = sum(self.sizes)
        weight = torch.cat([m.weight.detach() for m in linears])  # [sum(out), in]
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        bias = None
        if any(m.bias is not None for m in linears):
            bias = torch.cat([m.bias.detach() if m.bias is not None
                              else weight.new_zeros(m.out_features) for m in linears])
        self.register_buffer("bias", bias)
        self.outer = OuterRows(weight) if dual else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.outer is not None and self.outer.takes(x.numel() // self.in_features):
            return self.outer(x, self.bias)
        return mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.sizes}, "
                f"bias={self.bias is not None}, packed=oneDNN")


class FusedPackedLinear(PackedLinear):
    """Several projections of one input as one packed weight: -> each projection's output, as
    views of one result."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        return super().forward(x).split(self.sizes, dim=-1)  # [..., out_i] each


class FusedSlice(torch.nn.Module):
    """One member of a `FusedPackedLinear`, for code that calls the member by itself: runs the
    fused matmul and keeps its own part (the engine calls the fused module once instead)."""

    def __init__(self, fused: FusedPackedLinear, index: int) -> None:
        super().__init__()
        self.fused = fused  # the parent's fused module, shared by the sibling members
        self.index = index
        self.in_features = fused.in_features
        self.out_features = fused.sizes[index]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        return self.fused(x)[self.index]


# (parent module, its projections of one input, the attribute the fused module gets)
FUSED_GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj"), "fused_qkv"),
                ("mlp", ("gate_proj", "up_proj"), "fused_gate_up"))


def pack_decoder_layers(layers: torch.nn.ModuleList, dual: bool = False) -> int:
    """Pack the decoder layers' projections: each group of `FUSED_GROUPS` as one
    `FusedPackedLinear` (set as the parent's `fused_qkv` / `fused_gate_up`, its members
    becoming `FusedSlice`s), every other `nn.Linear` as a `PackedLinear`; `dual`: with an
    `OuterRows` copy each. -> how many packed weights."""
    count = 0
    for layer in layers:
        for parent_name, names, attr in FUSED_GROUPS:
            parent = getattr(layer, parent_name, None)
            members = [getattr(parent, n, None) for n in names]
            if (parent is None or not all(type(m) is torch.nn.Linear for m in members)
                    or len({m.in_features for m in members}) != 1):
                continue
            fused = FusedPackedLinear(members, dual)
            setattr(parent, attr, fused)
            count += 1
            for i, n in enumerate(names):
                setattr(parent, n, FusedSlice(fused, i))
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear:
                    setattr(parent, name, PackedLinear(child, dual))
                    count += 1
    return count


def resolve_packing(mode: str, device: torch.device | str, dtype: torch.dtype) -> str:
    """The packing a model gets: `auto` is `dual` for fp32 and `packed` for bf16 where this
    build can pack, else `off`; `dual` / `packed` where it cannot are an error."""
    if mode not in PACKING_MODES:
        raise ValueError(f"packing {mode!r}: one of {', '.join(PACKING_MODES)}")
    possible = can_pack(device, dtype)
    if mode == "auto":
        return ("dual" if dtype == torch.float32 else "packed") if possible else "off"
    if mode != "off" and not possible:
        raise ValueError(f"packing {mode!r} needs the CPU, fp32 or bf16 and oneDNN; this model "
                         f"is {dtype} on {device}")
    return mode
