"""Degenerate and decompression-bomb images are request errors, not crashes or answers."""

from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from vlcache.engine import Limits, RequestError
from vlcache.engine.request import load_image


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares `width` x `height` grey pixels and holds none (cheap to build)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IEND", b"")


@pytest.mark.parametrize("size", [(1, 1), (1, 50), (50, 1)])
def test_one_pixel_wide_image_is_too_small(size):
    buf = io.BytesIO()
    Image.new("RGB", size).save(buf, format="PNG")
    with pytest.raises(RequestError, match="below the minimum side") as info:
        load_image(buf.getvalue(), "img", Limits())
    assert info.value.status == 400 and info.value.code == "image_too_small"


def test_decompression_bomb_is_over_the_pixel_limit():
    limits = Limits(max_image_pixels=10**9)  # above PIL's own refusal (2 x 89.5 MP)
    with pytest.raises(RequestError, match="exceeds the limit") as info:
        load_image(png_header_only(20_000, 20_000), "img", limits)
    assert info.value.status == 413 and info.value.code == "image_too_large"
