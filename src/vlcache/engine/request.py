"""From chat messages to a prompt: images loaded, checked, preprocessed and keyed; token ids built.

Everything a request can get wrong is found here, before any compute or caching happens, and
the cheap checks come first (limits.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch
from PIL import Image

from vlcache.engine.images import decode_image, load_image, open_image
from vlcache.engine.limits import Limits, RequestError, TokenCount, check_budget, check_text
from vlcache.engine.patches import GridMismatchError, Patcher
from vlcache.keys import ModelFingerprint, image_key, segment_key

__all__ = ["Limits", "Messages", "PromptBuilder", "Prompt", "RequestError", "check_budget",
           "check_text", "load_image"]

VISION_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
# Marks where a document goes in the rendered chat text (refused in user text).
SEGMENT_SENTINEL = "\x00vlcache-segment\x00"
# A chat request as the engine takes it; a plain string is a raw prompt (no chat template).
Messages = list[dict[str, Any]] | str


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

    def build(self, messages: Messages) -> Prompt:
        """Checked, keyed segments and token ids; a string is a raw prompt (no chat template).

        Cheap checks come first: characters before tokenizing, image headers (sizes, grids,
        token counts) before decoding any pixels, and the token count as it grows.
        """
        if isinstance(messages, str):
            return self._build_raw(messages)
        if not isinstance(messages, list) or not messages:
            raise RequestError("messages must be a non-empty list", param="messages")
        flat = self._flatten(messages)
        check_budget(flat.chars, len(messages), self.limits)
        images = [(where, payload) for kind, where, payload in flat.parts if kind == "image"]
        if len(images) > self.limits.max_images:
            raise RequestError(f"{len(images)} images exceed the limit of "
                               f"{self.limits.max_images} per request", param="messages")
        if images and self.image_processor is None:
            raise RequestError("this model takes no images", param=images[0][0],
                               code="images_not_supported")
        opened = iter(self._open_images(images))
        count = TokenCount(self.limits)
        segments = []
        for kind, _, payload in flat.parts:
            seg = self._document(payload) if kind == "text" else self._image(*next(opened))
            count.add(seg.num_tokens, image=kind == "image")
            segments.append(seg)
        text = self.tokenizer.apply_chat_template(flat.messages, tokenize=False,
                                                  add_generation_prompt=True)
        pieces = text.split(SEGMENT_SENTINEL)
        if len(pieces) != 1 + sum(isinstance(s, PreparedText) for s in segments):
            raise RequestError("the text contains a reserved control sequence", param="messages")
        return self._assemble(pieces, segments, count)

    def _build_raw(self, text: str) -> Prompt:
        """A completion prompt: the text's tokens as they are, no chat template, no images."""
        check_text(text, "prompt")
        check_budget(len(text), 1, self.limits, param="prompt")
        ids = self.tokenizer(text)["input_ids"]
        if not ids:
            raise RequestError("the prompt is empty", param="prompt")
        if self.image_token_id is not None and self.image_token_id in ids:
            raise RequestError("the prompt contains image placeholder tokens; remove them",
                               param="prompt")
        TokenCount(self.limits, param="prompt").add(len(ids))
        return Prompt(torch.tensor(ids, dtype=torch.long))

    def _flatten(self, messages: list[dict[str, Any]]) -> _Flat:
        """Messages with string contents (segments replaced by placeholders), the segments'
        (kind, where, payload) in prompt order, and the characters of all their text."""
        flat, parts, chars = [], [], 0
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise RequestError(f"messages[{i}] needs a role", param=f"messages[{i}]")
            check_text(m["role"], f"messages[{i}].role")
            content = m.get("content", "")
            if isinstance(content, str):
                check_text(content, f"messages[{i}].content")
                flat.append({"role": m["role"], "content": content})
                chars += len(content)
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
                    continue
                if kind not in ("text", "document"):
                    raise RequestError(f"{where}: unknown content part type {kind!r} "
                                       "(expected 'text', 'image' or 'document')", param=where)
                text = str(part.get("text", ""))
                check_text(text, where)
                chars += len(text)
                if kind == "document" or part.get("cache"):
                    parts.append(("text", where, text))
                    pieces.append(SEGMENT_SENTINEL)
                else:
                    pieces.append(text)
            flat.append({"role": m["role"], "content": "".join(pieces)})
        return _Flat(flat, parts, chars)

    def _open_images(self, images: list[tuple[str, Any]]
                     ) -> list[tuple[str, Image.Image, torch.Tensor | None]]:
        """(where, opened image, predicted grid or None) of each image, from headers only;
        the request's total pixels and image tokens are checked before anything is decoded."""
        opened = [(where, open_image(payload, where, self.limits)) for where, payload in images]
        pixels = sum(im.size[0] * im.size[1] for _, im in opened)
        if pixels > self.limits.max_total_image_pixels:
            raise RequestError(f"the request's images have {pixels} pixels in all, over this "
                               f"server's limit of {self.limits.max_total_image_pixels} "
                               "(max_total_image_pixels)", param="messages",
                               code="image_pixels_exceeded", status=413)
        out = [(where, im, self._grid(im, where)) for where, im in opened]
        count = TokenCount(self.limits)
        for _, _, grid in out:
            if grid is not None:
                count.add(self.tokens_for_grid(grid), image=True)
        return out

    def _grid(self, image: Image.Image, where: str) -> torch.Tensor | None:
        try:
            return self.patcher.grid(*image.size)
        except ValueError as e:
            raise RequestError(f"{where}: the image processor rejected the image ({e})",
                               param=where, code="invalid_image") from None

    def _document(self, text: str) -> PreparedText:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        key = segment_key(ids, self.fingerprint, self.kv_dtype)
        return PreparedText(key=key, num_tokens=len(ids), token_ids=ids)

    def _image(self, where: str, opened: Image.Image, grid: torch.Tensor | None
               ) -> PreparedImage:
        image = decode_image(opened, where)
        pixels = None
        if grid is None:  # a processor whose grid cannot be predicted: run it now
            try:
                pixels, grid = self.patcher.patches(image)
            except ValueError as e:
                raise RequestError(f"{where}: the image processor rejected the image ({e})",
                                   param=where, code="invalid_image") from None
        key = image_key(image, grid, self.processor_settings, self.fingerprint, self.kv_dtype)
        return PreparedImage(key=key, num_tokens=self.tokens_for_grid(grid), image=image,
                             grid_thw=grid, patcher=self.patcher, _pixels=pixels)

    def _assemble(self, pieces: list[str], segments: list[PreparedSegment],
                  count: TokenCount) -> Prompt:
        """Tokenize the text between documents, splice documents in, expand image pads."""
        images = iter([s for s in segments if isinstance(s, PreparedImage)])
        texts = iter([s for s in segments if isinstance(s, PreparedText)])
        out: list[int] = []
        for n, piece in enumerate(pieces):
            ids = self.tokenizer(piece, add_special_tokens=False)["input_ids"]
            count.add(len(ids) - sum(t == self.image_token_id for t in ids))
            for t in ids:
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
        kept = [s for s in segments if s.num_tokens > 0]  # an empty document is plain text
        return Prompt(torch.tensor(out, dtype=torch.long), kept)


class _Flat(NamedTuple):
    messages: list[dict[str, str]]
    parts: list[tuple[str, str, Any]]  # (kind, where, payload)
    chars: int
