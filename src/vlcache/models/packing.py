"""Decoder weights pre-packed for oneDNN on the CPU.

PyTorch's plain CPU `linear` (MKL sgemm) is slow for a few rows: a repeated prompt's tail or a
moved image's recomputed tokens run 4–70 rows through every projection, where MKL takes up to
2× longer than oneDNN with weights reordered once into its own blocked layout
(docs/bench/README.md, "Packed weights"). So the language model's projections are packed once
after loading; their results differ from MKL's by rounding only (fp32: ~1e-5 absolute on
outputs of order 1; another summation order).

MKL stays faster for one row (a decode step, ~13%) and for more than 256 rows (fp32, one
thread, 24 layers' weights in turn: 2-3% at 264-512 rows, 14% at 1,052; oneDNN's packed
matmul steps up at 257 rows; `benchmarks/packed_linear.py --layers 24`), so the fp32 default
(`dual`) keeps the plain weight as well and sends those inputs to it: the decoder's weights are
held twice. `packed` holds only the packed copy (no extra memory); `off` packs nothing. For bf16
the two run at the same speed for many rows, so there `auto` packs only.

Projections of the same input are packed as one weight (`FusedPackedLinear`: q/k/v, and the
MLP's gate/up): for a few rows the time goes to reading the weights, and one call reads them a
little faster than three or two (one layer's seven projections: 6% faster at 12 rows, 3% at
28-70, the same from 284; `benchmarks/packed_linear.py`).
In `dual` the members stay plain `nn.Linear`s for one row and for many; in `packed` each member
becomes a `FusedSlice` of the fused weight, for code that calls it by itself (transformers' own
forward).

Only the decoder layers' projections are packed (the vision tower runs thousands of rows, where
packing gains nothing; `lm_head` runs one row and may share the embedding's weight). A packed
weight is an opaque oneDNN tensor: fingerprint the model before packing, and do not move it to
another device afterwards.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

mkldnn = torch.ops.mkldnn  # (a seam for the tests' spies)
PACKABLE_DTYPES = (torch.float32, torch.bfloat16)
PACKING_MODES = ("auto", "dual", "packed", "off")
PLAIN_ROWS = 257  # dual: inputs of one row, or this many or more, use the plain weight


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


def takes_packed(rows: int, plain_rows: int | None) -> bool:
    """Whether `rows` input rows use the packed weight: always without a plain one
    (`plain_rows` None); in `dual`, 2 to `plain_rows - 1` rows."""
    return plain_rows is None or 1 < rows < plain_rows


class PackedLinear(torch.nn.Module):
    """`nn.Linear`'s forward over a oneDNN-packed copy of its weight (the original is dropped)."""

    def __init__(self, linear: torch.nn.Linear, plain_rows: int | None = None) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()  # [out, in]
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        bias = None if linear.bias is None else linear.bias.detach().clone()
        self.register_buffer("bias", bias)
        # with `plain_rows`, the plain weight is kept too (twice the memory) and inputs of one
        # row or at least that many use it: MKL's sgemm is a few percent faster there
        self.plain_rows = plain_rows
        self.register_buffer("weight", weight if plain_rows is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if self.weight is not None and not takes_packed(x.numel() // self.in_features,
                                                        self.plain_rows):
            return F.linear(x, self.weight, self.bias)
        return mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, packed=oneDNN")


class FusedPackedLinear(torch.nn.Module):
    """Several projections of one input as one oneDNN-packed weight (their weights stacked on
    the output dimension): -> each projection's output, as views of one result."""

    def __init__(self, linears: list[torch.nn.Linear], plain_rows: int | None = None) -> None:
        super().__init__()
        if len({m.in_features for m in linears}) != 1:
            raise ValueError("fused projections must share their input size")
        self.in_features = linears[0].in_features
        self.sizes = [m.out_features for m in linears]
        weight = torch.cat([m.weight.detach() for m in linears])  # [sum(out), in]
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(weight, None))
        bias = None
        if any(m.bias is not None for m in linears):
            bias = torch.cat([m.bias.detach() if m.bias is not None
                              else weight.new_zeros(m.out_features) for m in linears])
        self.register_buffer("bias", bias)
        # with `plain_rows` (dual) the members keep their plain weights, which take one row
        # and at least that many; see `takes`
        self.plain_rows = plain_rows

    def takes(self, rows: int) -> bool:
        """Whether inputs of `rows` rows go through the fused weight (else the members)."""
        return takes_packed(rows, self.plain_rows)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:  # [..., in] -> [..., out_i]
        out = mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")
        return out.split(self.sizes, dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.sizes}, packed=oneDNN"


class FusedSlice(torch.nn.Module):
    """One member of a `FusedPackedLinear` where no plain weight is kept (`packed`), for code
    that calls the member by itself: runs the fused matmul and keeps its own part (the engine
    calls the fused module once instead)."""

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


def pack_decoder_layers(layers: torch.nn.ModuleList, plain_rows: int | None = None) -> int:
    """Pack the decoder layers' projections: each group of `FUSED_GROUPS` as one
    `FusedPackedLinear` (set as the parent's `fused_qkv` / `fused_gate_up`), every other
    `nn.Linear` as a `PackedLinear`; -> how many packed weights."""
    count = 0
    for layer in layers:
        fused_members: set[int] = set()
        for parent_name, names, attr in FUSED_GROUPS:
            parent = getattr(layer, parent_name, None)
            members = [getattr(parent, n, None) for n in names]
            if (parent is None or not all(type(m) is torch.nn.Linear for m in members)
                    or len({m.in_features for m in members}) != 1):
                continue
            fused = FusedPackedLinear(members, plain_rows)
            setattr(parent, attr, fused)
            count += 1
            if plain_rows is None:  # packed: the fused copy is the only one
                for i, n in enumerate(names):
                    setattr(parent, n, FusedSlice(fused, i))
            else:
                fused_members.update(id(m) for m in members)
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Linear and id(child) not in fused_members:
                    setattr(parent, name, PackedLinear(child, plain_rows))
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
