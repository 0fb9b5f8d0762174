"""Rotary position embedding applied to pre-RoPE keys/queries laid out as [S, heads, d]."""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(
    x: torch.Tensor,  # [S, heads, d] pre-RoPE
    cos: torch.Tensor,  # [S, d]
    sin: torch.Tensor,  # [S, d]
) -> torch.Tensor:  # [S, heads, d]
    """Rotate to the positions `cos`/`sin` were built for.

    Cached keys are stored before RoPE, so moving an image to a new place in a prompt is just
    this rotation at the new positions (M-RoPE tables already mix the three axes).
    """
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]
