"""Per-request limits and the cheap checks that come before the work they bound: characters
before tokenizing, and the token count as it grows."""

from __future__ import annotations

import re
from dataclasses import dataclass

_SURROGATE = re.compile("[\ud800-\udfff]")  # valid in a Python str, not in UTF-8
# Real text averages 3-5 characters per token; more than 8 is a run of repeats or padding.
CHARS_PER_TOKEN = 8


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
    """Per-request limits, checked before the work they bound: characters before tokenizing,
    image sizes from their headers before decoding. Pixels are counted as sent, before resizing.
    """

    max_images: int = 16
    max_image_pixels: int = 40_000_000  # one image
    max_total_image_pixels: int = 80_000_000  # all images of a request, decoded
    max_total_image_tokens: int = 16_384  # all images of a request (one 12.8 Mpx Qwen image)
    max_prompt_tokens: int = 32_768
    max_prompt_chars: int | None = None  # text of a request; None: 8 per allowed prompt token
    min_image_side: int = 2  # a 1-pixel-wide image carries nothing to look at

    def __post_init__(self) -> None:
        if self.max_prompt_chars is None:
            object.__setattr__(self, "max_prompt_chars", CHARS_PER_TOKEN * self.max_prompt_tokens)
        for name in ("max_images", "max_image_pixels", "max_total_image_pixels",
                     "max_total_image_tokens", "max_prompt_tokens", "max_prompt_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


def check_text(text: str, where: str) -> None:
    """Text the tokenizer can take: no lone UTF-16 surrogates (JSON lets "\\ud800" through)."""
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise RequestError(f"{where}: the text holds a lone surrogate {bad.group()!a} at "
                           f"character {bad.start()}, which is not valid Unicode", param=where,
                           code="invalid_text")


def check_budget(chars: int, messages: int, limits: Limits, param: str = "messages") -> None:
    """Refuses, before any tokenizing, text that cannot fit the prompt: more characters than
    `max_prompt_chars`, or more messages than `max_prompt_tokens` (each costs a token or more)."""
    if chars > limits.max_prompt_chars:
        raise RequestError(f"the prompt's text has {chars} characters, over this server's limit "
                           f"of {limits.max_prompt_chars} (max_prompt_chars)", param=param,
                           code="context_length_exceeded")
    if messages > limits.max_prompt_tokens:
        raise RequestError(f"{messages} messages cannot fit the limit of "
                           f"{limits.max_prompt_tokens} prompt tokens", param=param,
                           code="context_length_exceeded")


class TokenCount:
    """A request's prompt tokens as they are counted; over a limit -> RequestError at once."""

    def __init__(self, limits: Limits, param: str = "messages") -> None:
        self.limits = limits
        self.param = param
        self.tokens = 0
        self.image_tokens = 0

    def add(self, tokens: int, image: bool = False) -> None:
        self.tokens += tokens
        if image:
            self.image_tokens += tokens
            if self.image_tokens > self.limits.max_total_image_tokens:
                raise RequestError(f"the request's images take {self.image_tokens} tokens or "
                                   "more, over this server's limit of "
                                   f"{self.limits.max_total_image_tokens} "
                                   "(max_total_image_tokens)", param=self.param,
                                   code="image_tokens_exceeded")
        if self.tokens > self.limits.max_prompt_tokens:
            raise RequestError(f"prompt of {self.tokens} tokens or more exceeds the limit of "
                               f"{self.limits.max_prompt_tokens}", param=self.param,
                               code="context_length_exceeded")
