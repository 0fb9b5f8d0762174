"""Images from what a request carries (PIL images, bytes, paths): opened and checked from their
headers first, decoded only once every check has passed."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from PIL import Image, UnidentifiedImageError

from vlcache.engine.limits import Limits, RequestError


def open_image(source: Any, where: str, limits: Limits) -> Image.Image:
    """PIL image, bytes or a path -> an image whose header is read and checked (size within
    the limits), its pixels not yet decoded."""
    try:
        if isinstance(source, Image.Image):
            image = source
        elif isinstance(source, bytes | bytearray):
            image = Image.open(io.BytesIO(source))
        elif isinstance(source, str | Path):
            image = Image.open(Path(source))
        else:
            raise RequestError(f"{where}: expected an image, bytes or a path, got "
                               f"{type(source).__name__}", param=where)
    except Image.DecompressionBombError:  # PIL refuses before our own limit is checked
        raise _too_large(where, "so many pixels that PIL refuses it", limits) from None
    except UnidentifiedImageError:
        raise RequestError(f"{where}: cannot read the image (not a recognised image format)",
                           param=where, code="invalid_image") from None
    except (OSError, SyntaxError, ValueError) as e:
        if isinstance(e, RequestError):
            raise
        raise RequestError(f"{where}: cannot read the image ({e})", param=where,
                           code="invalid_image") from None
    w, h = image.size
    if w * h > limits.max_image_pixels:
        raise _too_large(where, f"{w}x{h} = {w * h} pixels", limits)
    if min(w, h) < limits.min_image_side:
        raise RequestError(f"{where}: image of {w}x{h} pixels is below the minimum side of "
                           f"{limits.min_image_side} pixels", param=where,
                           code="image_too_small")
    return image


def decode_image(image: Image.Image, where: str) -> Image.Image:
    """An opened image's pixels, decoded, as RGB; a broken file -> RequestError."""
    try:
        image.load()
        return image.convert("RGB")
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise RequestError(f"{where}: cannot read the image ({e})", param=where,
                           code="invalid_image") from None


def load_image(source: Any, where: str, limits: Limits) -> Image.Image:
    """PIL image, bytes or a path -> RGB image; unreadable or oversized input -> RequestError."""
    return decode_image(open_image(source, where, limits), where)


def _too_large(where: str, size: str, limits: Limits) -> RequestError:
    return RequestError(f"{where}: image of {size} exceeds the limit of "
                        f"{limits.max_image_pixels} pixels", param=where,
                        code="image_too_large", status=413)
