"""A spec to a PIL image: noise of exactly `tokens` image tokens, the same bytes in both
environments (numpy and PIL only; no vlcache import, so vLLM's environment can load it)."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image


def grid_for(tokens: int) -> tuple[int, int]:
    """(rows, cols) of merged patches with rows * cols == tokens, as square as possible."""
    if tokens < 1:
        raise ValueError(f"an image needs at least one token, got {tokens}")
    rows = max(r for r in range(1, math.isqrt(tokens) + 1) if tokens % r == 0)
    return rows, tokens // rows


def noise_image(tokens: int, seed: int, unit: int = 28) -> Image.Image:
    """RGB noise of (rows*unit) x (cols*unit) pixels; `unit` = patch size x merge size."""
    rows, cols = grid_for(tokens)
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (rows * unit, cols * unit, 3), dtype=np.uint8))


def materialize(messages: list[dict], image_part, unit: int = 28) -> list[dict]:
    """The spec's messages with each {"type": "image", "tokens", "seed"} part replaced by
    `image_part(pil_image)`, the engine's own form of an image part."""
    out = []
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            content = [image_part(noise_image(p["tokens"], p["seed"], unit))
                       if p["type"] == "image" else p for p in content]
        out.append({**m, "content": content})
    return out
