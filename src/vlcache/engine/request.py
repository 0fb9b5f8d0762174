"""From chat messages to a prompt: images loaded, checked, preprocessed and keyed; token ids built.

Everything a request can get wrong is found here, before any compute or caching happens.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from PIL import Image, UnidentifiedImageError

from vlcache.engine.patches import GridMismatchError, Patcher
from vlcache.keys import ModelFingerprint, image_key, segment_key

VISION_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
# Marks where a document goes in the rendered chat text (refused in user text).
SEGMENT_SENTINEL = "\x00vlcache-segment\x00"


class RequestError(ValueError):
    """A problem with the request itself (the server maps it to a 4xx answer)."""

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request",
                 status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.code = code
        self.status = status


@dataclass(frozen=True)
class Limits:
    """Per-request limits; pixels are counted on the image as sent, before resizing."""

    max_images: int = 16
    max_image_pixels: int = 40_000_000
    max_prompt_tokens: int = 32_768
    min_image_side: int = 2  # a 1-pixel-wide image carries nothing to look at


@dataclass(kw_only=True)
class PreparedSegment:
    """A span of the prompt whose KV is cached and reused on its own (design §1)."""

    key: str
    num_tokens: int
    start: int = -1  # index of its first token in the prompt


@dataclass(kw_only=True)
class PreparedImage(PreparedSegment):
    """An image keyed and placed by its grid; its patches are made on first use (a miss)."""

    image: Image.Image = field(repr=False)  # decoded, RGB
    grid_thw: torch.Tensor  # [3]
    patcher: Patcher = field(repr=False)
    _pixels: torch.Tensor | None = field(default=None, repr=False)

    @property
    def pixel_values(self) -> torch.Tensor:  # [P, C*T*ps*ps] preprocessed patches
        if self._pixels is None:
            pixels, grid = self.patcher.patches(self.image)
            if not torch.equal(grid, self.grid_thw):
                raise GridMismatchError(f"the image processor gave grid {grid.tolist()}, "
                                        f"{self.grid_thw.tolist()} was predicted")
            self._pixels = pixels
        return self._pixels


@dataclass(kw_only=True)
class PreparedText(PreparedSegment):
    """A reusable text segment (a document): its tokens are the same wherever it appears."""

    token_ids: list[int]


@dataclass
class Prompt:
    input_ids: torch.Tensor  # [S]
    segments: list[PreparedSegment] = field(default_factory=list)  # in prompt order

    @property
    def images(self) -> list[PreparedImage]:
        return [s for s in self.segments if isinstance(s, PreparedImage)]

    @property
    def grid_thw(self) -> torch.Tensor | None:  # [I, 3]
        images = self.images
        return torch.stack([im.grid_thw for im in images]) if images else None


def load_image(source: Any, where: str, limits: Limits) -> Image.Image:
    """PIL image, bytes or a path -> RGB image; unreadable or oversized input -> RequestError."""
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
        w, h = image.size
        if w * h > limits.max_image_pixels:
            raise _too_large(where, f"{w}x{h} = {w * h} pixels", limits)
        if min(w, h) < limits.min_image_side:
            raise RequestError(f"{where}: image of {w}x{h} pixels is below the minimum side of "
                               f"{limits.min_image_side} pixels", param=where,
                               code="image_too_small")
        image.load()
        return image.convert("RGB")
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


def _too_large(where: str, size: str, limits: Limits) -> RequestError:
    return RequestError(f"{where}: image of {size} exceeds the limit of "
                        f"{limits.max_image_pixels} pixels", param=where,
                        code="image_too_large", status=413)


class PromptBuilder:
    """Turns messages into a `Prompt` with the model's tokenizer, chat template and processor.

    Reusable segments are images and documents (a content part `{"type": "document", "text":
    ...}` or `{"type": "text", "text": ..., "cache": true}`). A document is tokenized on its own,
    so its token ids, and therefore its key, do not depend on what surrounds it.
    """

    def __init__(self, tokenizer, image_processor, fingerprint: ModelFingerprint,
                 kv_dtype: torch.dtype, image_token_id: int | None, tokens_for_grid,
                 limits: Limits) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor  # None: a text-only model
        self.patcher = Patcher(image_processor) if image_processor is not None else None
        self.fingerprint = fingerprint
        self.kv_dtype = kv_dtype
        self.image_token_id = image_token_id
        self.tokens_for_grid = tokens_for_grid
        self.limits = limits
        self.processor_settings = (json.loads(image_processor.to_json_string())
                                   if image_processor is not None else {})

    def build(self, messages: list[dict[str, Any]]) -> Prompt:
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages")
        flat, parts = self._flatten(messages)
        images = [p for p in parts if p[0] == "image"]
        if len(images) > self.limits.max_images:
            raise RequestError(f"{len(images)} images exceed the limit of "
                               f"{self.limits.max_images} per request", param="messages")
        if images and self.image_processor is None:
            raise RequestError("this model takes no images", param=images[0][1],
                               code="images_not_supported")
        segments = [self._prepare(kind, where, payload) for kind, where, payload in parts]
        text = self.tokenizer.apply_chat_template(flat, tokenize=False,
                                                  add_generation_prompt=True)
        pieces = text.split(SEGMENT_SENTINEL)
        if len(pieces) != 1 + sum(isinstance(s, PreparedText) for s in segments):
            raise RequestError("the text contains a reserved control sequence", param="messages")
        return self._assemble(pieces, segments)

    def _flatten(self, messages: list[dict[str, Any]]
                 ) -> tuple[list[dict[str, str]], list[tuple[str, str, Any]]]:
        """Messages with string contents (segments replaced by placeholders) and the segments'
        (kind, where, payload) in prompt order."""
        flat, parts = [], []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m:
                raise RequestError(f"messages[{i}] needs a role", param=f"messages[{i}]")
            content = m.get("content", "")
            if isinstance(content, str):
                flat.append({"role": m["role"], "content": content})
                continue
            if not isinstance(content, list):
                raise RequestError(f"messages[{i}].content must be a string or a list",
                                   param=f"messages[{i}].content")
            pieces = []
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "image":
                    parts.append(("image", where, part.get("image")))
                    pieces.append(VISION_PLACEHOLDER)
                elif kind == "document" or (kind == "text" and part.get("cache")):
                    parts.append(("text", where, str(part.get("text", ""))))
                    pieces.append(SEGMENT_SENTINEL)
                elif kind == "text":
                    pieces.append(str(part.get("text", "")))
                else:
                    raise RequestError(f"{where}: unknown content part type {kind!r} "
                                       "(expected 'text', 'image' or 'document')", param=where)
            flat.append({"role": m["role"], "content": "".join(pieces)})
        return flat, parts

    def _prepare(self, kind: str, where: str, payload: Any) -> PreparedSegment:
        if kind == "text":
            ids = self.tokenizer(payload, add_special_tokens=False)["input_ids"]
            key = segment_key(ids, self.fingerprint, self.kv_dtype)
            return PreparedText(key=key, num_tokens=len(ids), token_ids=ids)
        image = load_image(payload, where, self.limits)
        pixels = None
        try:
            grid = self.patcher.grid(*image.size)
            if grid is None:  # a processor whose grid cannot be predicted: run it now
                pixels, grid = self.patcher.patches(image)
        except ValueError as e:
            raise RequestError(f"{where}: the image processor rejected the image ({e})",
                               param=where, code="invalid_image") from None
        key = image_key(image, grid, self.processor_settings, self.fingerprint, self.kv_dtype)
        return PreparedImage(key=key, num_tokens=self.tokens_for_grid(grid), image=image,
                             grid_thw=grid, patcher=self.patcher, _pixels=pixels)

    def _assemble(self, pieces: list[str], segments: list[PreparedSegment]) -> Prompt:
        """Tokenize the text between documents, splice documents in, expand image pads."""
        images = iter([s for s in segments if isinstance(s, PreparedImage)])
        texts = iter([s for s in segments if isinstance(s, PreparedText)])
        out: list[int] = []
        for n, piece in enumerate(pieces):
            for t in self.tokenizer(piece, add_special_tokens=False)["input_ids"]:
                if t != self.image_token_id:
                    out.append(t)
                    continue
                image = next(images, None)
                if image is None:
                    raise RequestError("the text contains image placeholder tokens; remove them",
                                       param="messages")
                image.start = len(out)
                out.extend([t] * image.num_tokens)
            if n < len(pieces) - 1:
                doc = next(texts)
                doc.start = len(out)
                out.extend(doc.token_ids)
        if next(images, None) is not None:
            raise RequestError("an image placeholder went missing in the chat template",
                               param="messages")
        if len(out) > self.limits.max_prompt_tokens:
            raise RequestError(f"prompt of {len(out)} tokens exceeds the limit of "
                               f"{self.limits.max_prompt_tokens}", param="messages",
                               code="context_length_exceeded")
        kept = [s for s in segments if s.num_tokens > 0]  # an empty document is plain text
        return Prompt(torch.tensor(out, dtype=torch.long), kept)
