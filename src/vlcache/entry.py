"""What the cache holds for one image: its encoder output and its per-layer pre-RoPE KV."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ImageEntry:
    """Everything reusable about one image, computed once in some request's context.

    `keys` are stored *before* RoPE (after the per-head k-norm for models that have one), so they
    can be rotated to whatever position the image occupies in a later prompt.
    """

    embeds: torch.Tensor  # [N, H] vision-tower output after the patch merger
    deepstack: torch.Tensor | None = None  # [D, N, H] Qwen3-VL deepstack features, else None
    keys: torch.Tensor | None = None  # [L, N, kv_heads, head_dim] pre-RoPE
    values: torch.Tensor | None = None  # [L, N, kv_heads, head_dim]
    positions: torch.Tensor | None = None  # [3, N] M-RoPE positions the KV was computed at
    # [32] uint8 blake3 of everything before the image when its KV was computed (token ids and
    # earlier images' keys): what exact prefix caching compares against
    context: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = self.embeds.shape[0]
        if (self.keys is None) != (self.values is None):
            raise ValueError("an entry has both keys and values or neither")
        if self.keys is not None and self.values is not None:
            if self.keys.shape != self.values.shape or self.keys.shape[1] != n:
                raise ValueError(
                    f"KV shapes {tuple(self.keys.shape)}/{tuple(self.values.shape)} "
                    f"do not match {n} image tokens"
                )
        if self.deepstack is not None and self.deepstack.shape[1] != n:
            raise ValueError("deepstack features do not match the image token count")

    @property
    def num_tokens(self) -> int:
        return int(self.embeds.shape[0])

    @property
    def has_kv(self) -> bool:
        return self.keys is not None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The entry's tensors by name (absent parts left out); the inverse is `from_tensors`."""
        names = ("embeds", "deepstack", "keys", "values", "positions", "context")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> ImageEntry:
        return cls(**tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def without_kv(self) -> ImageEntry:
        return ImageEntry(embeds=self.embeds, deepstack=self.deepstack)
