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

from vlcache.keys import ModelFingerprint, image_key

VISION_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


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


@dataclass
class PreparedImage:
    pixel_values: torch.Tensor  # [P, C*T*ps*ps] preprocessed patches
    grid_thw: torch.Tensor  # [3]
    key: str
    num_tokens: int
    start: int = -1  # index of its first token in the prompt


@dataclass
class Prompt:
    input_ids: torch.Tensor  # [S]
    images: list[PreparedImage] = field(default_factory=list)  # in prompt order

    @property
    def grid_thw(self) -> torch.Tensor | None:  # [I, 3]
        return torch.stack([im.grid_thw for im in self.images]) if self.images else None


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
            raise RequestError(
                f"{where}: image of {w}x{h} = {w * h} pixels exceeds the limit of "
                f"{limits.max_image_pixels} pixels", param=where, code="image_too_large",
                status=413)
        image.load()
        return image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as e:
        if isinstance(e, RequestError):
            raise
        raise RequestError(f"{where}: cannot read the image ({e})", param=where,
                           code="invalid_image") from None


class PromptBuilder:
    """Turns messages into a `Prompt` with the model's tokenizer, chat template and processor."""

    def __init__(self, tokenizer, image_processor, fingerprint: ModelFingerprint,
                 kv_dtype: torch.dtype, image_token_id: int, tokens_for_grid,
                 limits: Limits) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.fingerprint = fingerprint
        self.kv_dtype = kv_dtype
        self.image_token_id = image_token_id
        self.tokens_for_grid = tokens_for_grid
        self.limits = limits
        self.processor_settings = json.loads(image_processor.to_json_string())

    def build(self, messages: list[dict[str, Any]]) -> Prompt:
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages")
        flat, sources = self._flatten(messages)
        if len(sources) > self.limits.max_images:
            raise RequestError(f"{len(sources)} images exceed the limit of "
                               f"{self.limits.max_images} per request", param="messages")
        images = [self._prepare(load_image(src, where, self.limits), where)
                  for where, src in sources]
        text = self.tokenizer.apply_chat_template(flat, tokenize=False,
                                                  add_generation_prompt=True)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return self._expand(ids, images)

    def _flatten(self, messages: list[dict[str, Any]]) -> tuple[list[dict[str, str]], list]:
        flat, sources = [], []
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
                if kind == "text":
                    pieces.append(str(part.get("text", "")))
                elif kind == "image":
                    sources.append((where, part.get("image")))
                    pieces.append(VISION_PLACEHOLDER)
                else:
                    raise RequestError(f"{where}: unknown content part type {kind!r} "
                                       "(expected 'text' or 'image')", param=where)
            flat.append({"role": m["role"], "content": "".join(pieces)})
        return flat, sources

    def _prepare(self, image: Image.Image, where: str) -> PreparedImage:
        try:
            out = self.image_processor(images=[image], return_tensors="pt")
        except ValueError as e:
            raise RequestError(f"{where}: the image processor rejected the image ({e})",
                               param=where, code="invalid_image") from None
        pixels, grid = out["pixel_values"], out["image_grid_thw"][0]
        key = image_key(pixels, grid, self.processor_settings, self.fingerprint, self.kv_dtype)
        return PreparedImage(pixels, grid, key, self.tokens_for_grid(grid))

    def _expand(self, ids: list[int], images: list[PreparedImage]) -> Prompt:
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise RequestError("the text contains image placeholder tokens; remove them",
                               param="messages")
        out: list[int] = []
        prev = 0
        for slot, image in zip(slots, images, strict=True):
            out.extend(ids[prev:slot])
            image.start = len(out)
            out.extend([self.image_token_id] * image.num_tokens)
            prev = slot + 1
        out.extend(ids[prev:])
        if len(out) > self.limits.max_prompt_tokens:
            raise RequestError(f"prompt of {len(out)} tokens exceeds the limit of "
                               f"{self.limits.max_prompt_tokens}", param="messages",
                               code="context_length_exceeded")
        return Prompt(torch.tensor(out, dtype=torch.long), images)
