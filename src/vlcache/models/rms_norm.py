"""RMSNorm over rows in cache-sized chunks, with the same operations as transformers' own.

transformers' RMSNorm (Qwen2, Qwen2-VL, Qwen2.5-VL, Qwen3, Qwen3-VL text, Llama) makes five
passes over the whole tensor (square, mean, add + rsqrt, scale, weight). Over a prompt's
thousands of rows every pass goes out to memory: 2,061 rows of the fixture's 896 features take
5.7 ms a call on one core, and the fixture's decoder calls it 49 times a prompt. The same passes
over chunks of ~512 KB stay in the core's cache and take 2.3 ms (2.5x; the same at 4,124
rows, none at 284; `benchmarks/elementwise.py`). Each row sees the same operations in the same
order as in the module it replaces, so the results are bit-identical
(tests/models/test_rms_norm.py).
"""

from __future__ import annotations

import torch

# the classes whose forward is exactly `weight * (x * rsqrt(mean(x^2) + eps)).to(dtype)`,
# computed in fp32 (checked against each class in the tests)
RMS_NORM_CLASSES = {"Qwen2RMSNorm", "Qwen2VLRMSNorm", "Qwen2_5_VLRMSNorm", "Qwen3RMSNorm",
                    "Qwen3VLTextRMSNorm", "LlamaRMSNorm"}
CHUNK_ELEMENTS = 1 << 17  # per chunk: 128 K fp32 values, 512 KB


class ChunkedRMSNorm(torch.nn.Module):
    """Stands in for one of `RMS_NORM_CLASSES`; keeps its `weight` parameter (same name, same
    tensor), so state dicts and fingerprints do not change. For inference: no gradients."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight = norm.weight  # [F]
        self.variance_epsilon: float = norm.variance_epsilon
        self.replaced: str = type(norm).__name__

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., F] -> [..., F]
        features = x.shape[-1]
        rows = x.reshape(-1, features)  # [R, F]
        step = max(1, CHUNK_ELEMENTS // features)
        if rows.shape[0] <= step:
            return self._norm(x)
        out = torch.empty(rows.shape, dtype=torch.result_type(self.weight, x), device=x.device)
        for start in range(0, rows.shape[0], step):
            self._norm(rows[start:start + step], out=out[start:start + step])
        return out.view(x.shape)

    def _norm(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return torch.mul(self.weight.detach(), x.to(dtype), out=out)  # inference only

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, chunked {self.replaced}"


def chunk_rms_norms(model: torch.nn.Module) -> int:
    """Replace every RMSNorm of `RMS_NORM_CLASSES` inside `model` by a `ChunkedRMSNorm`;
    -> how many were replaced."""
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ in RMS_NORM_CLASSES:
                setattr(parent, name, ChunkedRMSNorm(child))
                count += 1
    return count
