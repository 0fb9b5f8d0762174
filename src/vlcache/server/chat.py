"""POST /v1/chat/completions: messages (images resolved to bytes) become an engine job; its
events become a `chat.completion` or a stream of `chat.completion.chunk`s."""

from __future__ import annotations

import time
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from vlcache.engine import GenerationResult
from vlcache.engine.limits import check_budget
from vlcache.server.media import MediaResolver
from vlcache.server.schemas import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    Message,
    Usage,
)
from vlcache.server.serving import Serving


class ChatCompletions:
    """The chat endpoint: budgets, media, then the shared job and answer handling."""

    def __init__(self, serving: Serving, media: MediaResolver) -> None:
        self.serving = serving
        self.media = media

    async def __call__(self, body: ChatCompletionRequest, request: Request) -> Response:
        deadline = time.monotonic() + self.serving.config.request_timeout_s  # media counts too
        self.serving.check_model(body)
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        sampling = self.serving.sampling(body, body.max_completion_tokens or body.max_tokens,
                                         param)
        chars = sum(len(p.text or "") for m in body.messages for p in m.content or [])
        check_budget(chars, len(body.messages), self.serving.limits)  # before the queue
        messages = await engine_messages(body.messages, self.media)
        return await self.serving.run(body, messages, sampling, deadline, request, ChatShape(),
                                      "chatcmpl")


class ChatShape:
    """`chat.completion` answers and `chat.completion.chunk` events."""

    def answer(self, head: dict[str, Any], result: GenerationResult,
               usage: Usage) -> ChatCompletion:
        return ChatCompletion(**head, usage=usage, choices=[Choice(
            message=AssistantMessage(content=result.text),
            finish_reason=result.finish_reason)])  # type: ignore[arg-type]

    def opening(self, head: dict[str, Any]) -> ChatCompletionChunk:
        return ChatCompletionChunk(**head, choices=[ChunkChoice(
            delta=Delta(role="assistant", content=""))])

    def delta(self, head: dict[str, Any], text: str) -> ChatCompletionChunk:
        return ChatCompletionChunk(**head, choices=[ChunkChoice(delta=Delta(content=text))])

    def finish(self, head: dict[str, Any], reason: str) -> ChatCompletionChunk:
        return ChatCompletionChunk(**head, choices=[ChunkChoice(
            delta=Delta(), finish_reason=reason)])  # type: ignore[arg-type]

    def usage(self, head: dict[str, Any], usage: Usage) -> ChatCompletionChunk:
        return ChatCompletionChunk(**head, choices=[], usage=usage)


async def engine_messages(messages: list[Message], media: MediaResolver) -> list[dict]:
    """Wire messages -> engine messages, with every image URL resolved to bytes."""
    out = []
    for i, m in enumerate(messages):
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(m.content or []):
            if part.image_url is not None and part.type == "image_url":
                where = f"messages[{i}].content[{j}]"
                parts.append({"type": "image", "image": await media.load(part.image_url.url,
                                                                          where)})
            else:
                parts.append({"type": "text", "text": part.text or "", "cache": part.cache})
        out.append({"role": "system" if m.role == "developer" else m.role, "content": parts})
    return out
