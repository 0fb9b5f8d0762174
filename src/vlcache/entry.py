"""What the cache holds for one segment (an image or a document): encoder output and pre-RoPE KV."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ImageEntry:
    """Everything reusable about one segment, computed once in some request's context.

    Images carry their encoder output (`embeds`); text segments (documents) carry KV only, since
    their embeddings are a table lookup. `keys` are stored *before* RoPE (after the per-head
    k-norm for models that have one), so they can be rotated to wherever the segment sits in a
    later prompt.
    """

    embeds: torch.Tensor | None = None  # [N, H] vision-tower output after the merger (images)
    deepstack: torch.Tensor | None = None  # [D, N, H] Qwen3-VL deepstack features, else None
    keys: torch.Tensor | None = None  # [L, N, kv_heads, head_dim] pre-RoPE
    values: torch.Tensor | None = None  # [L, N, kv_heads, head_dim]
    positions: torch.Tensor | None = None  # [3, N] M-RoPE positions the KV was computed at
    # [32] uint8 blake3 of everything before the image when its KV was computed (token ids and
    # earlier images' keys): what exact prefix caching compares against
    context: torch.Tensor | None = None
    # Optional: the segment's hidden state entering layer `hidden_layer` ([1] int64), [N, H], in
    # the same context as its KV. A plan that starts recomputing at that layer resumes from it.
    hidden: torch.Tensor | None = None
    hidden_layer: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.embeds is None and self.keys is None:
            raise ValueError("an entry needs an encoder output, KV, or both")
        n = self.num_tokens
        if (self.keys is None) != (self.values is None):
            raise ValueError("an entry has both keys and values or neither")
        if self.keys is not None and self.values is not None:
            if self.keys.shape != self.values.shape or self.keys.shape[1] != n:
                raise ValueError(
                    f"KV shapes {tuple(self.keys.shape)}/{tuple(self.values.shape)} "
                    f"do not match {n} tokens"
                )
        if self.deepstack is not None and self.deepstack.shape[1] != n:
            raise ValueError("deepstack features do not match the image token count")
        if (self.hidden is None) != (self.hidden_layer is None):
            raise ValueError("an entry has both a hidden state and its layer or neither")
        if self.hidden is not None:
            if self.keys is None:
                raise ValueError("a hidden state is only useful beside the KV it belongs to")
            if self.hidden.shape[0] != n or self.hidden_layer.numel() != 1:
                raise ValueError(f"hidden state {tuple(self.hidden.shape)} does not match {n} "
                                 "tokens, or its layer is not one number")

    @property
    def resume_layer(self) -> int | None:
        """The layer whose input `hidden` is, if the entry holds one."""
        return None if self.hidden_layer is None else int(self.hidden_layer.item())

    @property
    def num_tokens(self) -> int:
        return int(self.embeds.shape[0] if self.embeds is not None else self.keys.shape[1])

    @property
    def has_kv(self) -> bool:
        return self.keys is not None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The entry's tensors by name (absent parts left out); the inverse is `from_tensors`."""
        names = ("embeds", "deepstack", "keys", "values", "positions", "context", "hidden",
                 "hidden_layer")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> ImageEntry:
        return cls(**tensors)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    def without_kv(self) -> ImageEntry:
        if self.embeds is None:
            raise ValueError("a text segment's entry is nothing without its KV")
        return ImageEntry(embeds=self.embeds, deepstack=self.deepstack)
