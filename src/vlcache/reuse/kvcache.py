"""A request's own KV cache: rotated keys and values per layer, grown by decoding."""

from __future__ import annotations

import torch


class KVCache:
    """Per layer, keys (after RoPE) and values `[kv_heads, capacity, d]`; `length` are valid."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        shape = (kv_heads, capacity, head_dim)
        self.keys = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.capacity = capacity
        self.length = 0

    def write_prefill(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Set the first S positions of a layer from [S, kvh, d] tensors (k already rotated)."""
        s = k.shape[0]
        if s > self.capacity:
            raise ValueError(f"prompt of {s} tokens exceeds the KV cache capacity {self.capacity}")
        self.keys[layer][:, :s] = k.transpose(0, 1)
        self.values[layer][:, :s] = v.transpose(0, 1)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor,
                                                                              torch.Tensor]:
        """Write one decode step's [t, kvh, d] at `length`; return the valid [kvh, length+t, d]."""
        t = k.shape[0]
        end = self.length + t
        if end > self.capacity:
            raise ValueError("KV cache is full")
        self.keys[layer][:, self.length:end] = k.transpose(0, 1)
        self.values[layer][:, self.length:end] = v.transpose(0, 1)
        return self.keys[layer][:, :end], self.values[layer][:, :end]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)
