"""POST /v1/completions: one prompt string, completed as it is (no chat template, no images);
answered as a `text_completion` or a stream of them."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from vlcache.engine import GenerationResult
from vlcache.engine.limits import check_budget
from vlcache.server.schemas import Completion, CompletionChoice, CompletionRequest, Usage
from vlcache.server.serving import Serving


class Completions:
    """The completions endpoint: the prompt's budget, then the shared job and answer handling."""

    def __init__(self, serving: Serving) -> None:
        self.serving = serving

    async def __call__(self, body: CompletionRequest, request: Request) -> Response:
        deadline = time.monotonic() + self.serving.config.request_timeout_s
        self.serving.check_model(body)
        sampling = self.serving.sampling(body, body.max_tokens, "max_tokens")
        check_budget(len(body.prompt), 1, self.serving.limits, param="prompt")
        return await self.serving.run(body, body.prompt, sampling, deadline, request,
                                      CompletionShape(), "cmpl")


class CompletionShape:
    """`text_completion` answers; streamed chunks are `text_completion`s too."""

    def answer(self, head: dict[str, Any], result: GenerationResult, usage: Usage) -> Completion:
        return Completion(**head, usage=usage, choices=[CompletionChoice(
            text=result.text, finish_reason=result.finish_reason)])  # type: ignore[arg-type]

    def opening(self, head: dict[str, Any]) -> None:
        return None

    def delta(self, head: dict[str, Any], text: str) -> Completion:
        return Completion(**head, choices=[CompletionChoice(text=text)])

    def finish(self, head: dict[str, Any], reason: str) -> Completion:
        return Completion(**head, choices=[CompletionChoice(
            text="", finish_reason=reason)])  # type: ignore[arg-type]

    def usage(self, head: dict[str, Any], usage: Usage) -> Completion:
        return Completion(**head, choices=[], usage=usage)
