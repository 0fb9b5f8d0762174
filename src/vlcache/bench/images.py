"""Synthetic images whose preprocessed form is an exact number of image tokens."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image


def token_unit(image_processor) -> int:
    """Pixels per image token along one side: patch size times merge size (28 or 32)."""
    return int(image_processor.patch_size) * int(image_processor.merge_size)


def grid_for(tokens: int) -> tuple[int, int]:
    """(rows, cols) of merged patches with rows * cols == tokens, as square as possible."""
    if tokens < 1:
        raise ValueError(f"an image needs at least one token, got {tokens}")
    rows = max(r for r in range(1, math.isqrt(tokens) + 1) if tokens % r == 0)
    return rows, tokens // rows


def synth_image(tokens: int, unit: int, seed: int = 0) -> Image.Image:
    """Random RGB noise of (rows*unit) x (cols*unit) pixels: `tokens` tokens, no resizing.

    Noise, not a photo: timing does not depend on content, and noise makes every seed a
    different cache key.
    """
    rows, cols = grid_for(tokens)
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (rows * unit, cols * unit, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def allow_tokens(image_processor, tokens: int) -> None:
    """Raise the processor's pixel cap so an image of `tokens` tokens keeps its size."""
    unit = token_unit(image_processor)
    need = tokens * unit * unit
    size = image_processor.size
    if (size.get("longest_edge") or 0) < need:
        size["longest_edge"] = need
    if getattr(image_processor, "max_pixels", None) is not None:
        image_processor.max_pixels = max(image_processor.max_pixels, need)
