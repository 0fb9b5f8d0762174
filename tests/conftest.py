"""Shared fixtures: tiny random-initialised checkpoints of the three supported architectures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlcache.models.synthetic import TINY, TINY_TEXT, save_checkpoint

ARCHS = sorted(TINY)
TEXT_ARCHS = sorted(TINY_TEXT)


@pytest.fixture(scope="session")
def tiny_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {arch: save_checkpoint(root / arch, TINY[arch], seed=0) for arch in ARCHS}


@pytest.fixture(scope="session")
def tiny_text_checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("text-checkpoints")
    return {arch: save_checkpoint(root / arch, TINY_TEXT[arch], seed=0) for arch in TEXT_ARCHS}


def document(text: str) -> dict:
    """A reusable text segment as a content part."""
    return {"type": "document", "text": text}


def random_image(seed: int, width: int = 112, height: int = 84) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def user(*parts: object, role: str = "user") -> dict:
    """A message from text strings and PIL images, in order."""
    content = [{"type": "text", "text": p} if isinstance(p, str)
               else p if isinstance(p, dict) else {"type": "image", "image": p} for p in parts]
    return {"role": role, "content": content}
