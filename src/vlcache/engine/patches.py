"""An image's patch grid without preprocessing it; its patches only when the vision tower runs.

A cache hit needs the grid (it fixes the image's token count and M-RoPE positions) and a key,
but not the patches: those feed only the vision tower, which a hit skips. Resizing, normalising,
patchifying and hashing the patches took 30 ms of a 36 ms hit on the tiny test model and 13% of
a `naive` hit on the 0.5B fixture at 4,096 image tokens (docs/bench/README.md), so the patches
are made only when a miss asks for them (`PreparedImage.pixel_values`).

The grid is predicted with the processor's own `smart_resize`, for the Qwen2-VL family's image
processor (Qwen2-VL, Qwen2.5-VL and Qwen3-VL all use it); any other processor is run eagerly.
"""

from __future__ import annotations

import torch
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
    Qwen2VLImageProcessorPil,
    smart_resize,
)


class GridMismatchError(RuntimeError):
    """The processor produced another grid than predicted (a bug: positions would be wrong)."""


class Patcher:
    """Predicts an image's grid from its size; runs the image processor when asked."""

    def __init__(self, processor) -> None:
        self.processor = processor
        size = getattr(processor, "size", None) or {}
        self.predicts = (
            isinstance(processor, Qwen2VLImageProcessorPil)
            and bool(processor.do_resize)
            and bool(size.get("shortest_edge"))
            and bool(size.get("longest_edge"))
        )

    def grid(self, width: int, height: int) -> torch.Tensor | None:  # [3] (t, h, w) or None
        """The grid the processor will produce for an image of this size (None: unknown)."""
        if not self.predicts:
            return None
        p = self.processor
        h, w = smart_resize(height, width, factor=p.patch_size * p.merge_size,
                            min_pixels=p.size["shortest_edge"], max_pixels=p.size["longest_edge"])
        return torch.tensor([1, h // p.patch_size, w // p.patch_size], dtype=torch.long)

    def patches(self, image: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values [P, C*T*ps*ps], grid_thw [3]) of one RGB image."""
        out = self.processor(images=[image], return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"][0]
