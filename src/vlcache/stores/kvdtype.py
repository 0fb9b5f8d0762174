"""Storing an entry's KV in a smaller dtype than the model computes in.

bf16/fp16/fp32 are plain casts: the store hands back KV in that dtype and the engine upcasts.
fp8 (e4m3, when the torch build has it) needs a scale: each (layer, kv head) is scaled by its
absolute maximum so that the largest value lands on fp8's largest finite value, and the store
dequantises back to the dtype the entry was put with.
"""

from __future__ import annotations

import torch

from vlcache.entry import ImageEntry

KV_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}
FP8 = getattr(torch, "float8_e4m3fn", None)
if FP8 is not None:
    KV_DTYPES["fp8"] = FP8

_NAMES = {dtype: name for name, dtype in KV_DTYPES.items()}
_KV = ("keys", "values")


def parse_kv_dtype(text: str | torch.dtype | None) -> torch.dtype | None:
    """'bf16' -> torch.bfloat16; None, '' or 'native' -> None (keep KV as given)."""
    if text is None or isinstance(text, torch.dtype):
        if text is not None and text not in _NAMES:
            raise ValueError(f"unsupported KV dtype {text}: expected one of {sorted(KV_DTYPES)}")
        return text
    t = text.strip().lower()
    if t in {"", "native"}:
        return None
    if t not in KV_DTYPES:
        raise ValueError(f"unsupported KV dtype {text!r}: expected one of {sorted(KV_DTYPES)}")
    return KV_DTYPES[t]


def kv_dtype_name(dtype: torch.dtype | None) -> str:
    return "native" if dtype is None else _NAMES[dtype]


def pack(
    entry: ImageEntry, kv_dtype: torch.dtype | None
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors to hold for `entry` with its KV in `kv_dtype`, and what `unpack` needs."""
    tensors = entry.tensors()
    if kv_dtype is None or entry.keys is None:
        return tensors, {}
    meta = {"kv_source_dtype": str(entry.keys.dtype).removeprefix("torch.")}
    for name in _KV:
        kv = tensors[name]  # [L, N, kv_heads, head_dim]
        if kv_dtype == FP8:
            tensors[name], tensors[f"{name}_scale"] = _quantise_fp8(kv)
        else:
            tensors[name] = kv.to(kv_dtype)
    return tensors, meta


def unpack(tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> ImageEntry:
    """The inverse of `pack` (fp8 KV comes back in the dtype it was put with)."""
    tensors = dict(tensors)
    for name in _KV:
        scale = tensors.pop(f"{name}_scale", None)
        if scale is not None:
            source = getattr(torch, meta.get("kv_source_dtype", "float32"))
            tensors[name] = (tensors[name].to(torch.float32) * scale).to(source)
    return ImageEntry.from_tensors(tensors)


def _quantise_fp8(kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert FP8 is not None
    # per (layer, head): [L, 1, kv_heads, 1]
    amax = kv.detach().abs().amax(dim=(1, 3), keepdim=True).to(torch.float32)
    scale = (amax / torch.finfo(FP8).max).clamp_min(torch.finfo(torch.float32).tiny)
    return (kv.to(torch.float32) / scale).to(FP8), scale
