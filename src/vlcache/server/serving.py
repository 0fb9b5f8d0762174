"""POST /v1/chat/completions: a request becomes an engine job; its events become one JSON answer
or a stream of server-sent events in OpenAI's chunk format."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from vlcache.engine import GenerationResult
from vlcache.server.config import ServerConfig
from vlcache.server.errors import APIError, as_api_error
from vlcache.server.media import MediaResolver
from vlcache.server.metrics import Metrics
from vlcache.server.schemas import (
    AssistantMessage,
    CacheUsage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    Message,
    PromptTokensDetails,
    Usage,
)
from vlcache.server.worker import Job, ModelWorker, QueueFull, queue_wait

POLL_S = 0.25  # how often a request waiting for its first token checks for a disconnect
CLIENT_CLOSED = 499  # nginx's status for "the client went away"; only the metrics see it


class ClientGone(Exception):
    """The client disconnected before its answer started."""


class ChatCompletions:
    """The chat endpoint: validation, media, queueing, and the two answer shapes."""

    def __init__(self, config: ServerConfig, worker: ModelWorker, media: MediaResolver,
                 metrics: Metrics) -> None:
        self.config = config
        self.worker = worker
        self.media = media
        self.metrics = metrics

    async def __call__(self, body: ChatCompletionRequest, request: Request) -> Response:
        deadline = time.monotonic() + self.config.request_timeout_s  # media fetches count too
        if body.model is not None and body.model != self.config.model_name:
            raise APIError(404, f"model {body.model!r} is not served here (this server "
                           f"serves {self.config.model_name!r})", param="model",
                           code="model_not_found")
        sampling = self._sampling(body)
        messages = await engine_messages(body.messages, self.media)
        job = Job(messages, sampling, asyncio.get_running_loop(), deadline=deadline)
        try:
            self.worker.submit(job)
        except QueueFull as e:
            raise APIError(503, f"the server is busy ({self.worker.max_queue} requests "
                           "queued); retry later", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        try:
            first = await self._next(job, request)
            if first[0] == "error":  # a bad request fails before its first token
                raise as_api_error(first[1])
            if body.stream:  # the stream's own cleanup cancels the job from here on
                return StreamingResponse(self._stream(job, first, body.include_usage),
                                         media_type="text/event-stream",
                                         headers={"Cache-Control": "no-cache"})
            result = await self._collect(job, first, request)
        except ClientGone:
            self.worker.cancel(job)
            return Response(status_code=CLIENT_CLOSED)
        except BaseException:
            self.worker.cancel(job)
            raise
        self.metrics.observe(result.stats, queue_wait(job))
        answer = ChatCompletion(
            id=_completion_id(), created=int(time.time()), model=self.config.model_name,
            choices=[Choice(message=AssistantMessage(content=result.text),
                            finish_reason=result.finish_reason)],  # type: ignore[arg-type]
            usage=usage(result, queue_wait(job)))
        return JSONResponse(answer.model_dump(mode="json"))

    def _sampling(self, body: ChatCompletionRequest) -> dict[str, Any]:
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        max_tokens = body.max_completion_tokens or body.max_tokens or \
            self.config.default_max_tokens
        if max_tokens > self.config.max_tokens_limit:
            raise APIError(400, f"{param}: {max_tokens} exceeds this server's limit of "
                           f"{self.config.max_tokens_limit}", param=param,
                           code="max_tokens_too_large")
        return {"max_tokens": max_tokens,
                "temperature": 1.0 if body.temperature is None else body.temperature,
                "top_p": 1.0 if body.top_p is None else body.top_p,
                "stop": tuple(body.stop or ()), "seed": body.seed}

    async def _next(self, job: Job, request: Request | None) -> tuple[str, Any]:
        """The job's next event; 504 past its deadline; ClientGone if `request` disconnects."""
        while True:
            left = job.deadline - time.monotonic()
            if left <= 0:
                raise APIError(504, "the request did not finish within "
                               f"{self.config.request_timeout_s:g} s", code="timeout")
            try:
                wait = left if request is None else min(left, POLL_S)
                return await asyncio.wait_for(job.events.get(), wait)
            except asyncio.TimeoutError:
                if request is not None and await request.is_disconnected():
                    raise ClientGone from None

    async def _collect(self, job: Job, first: tuple[str, Any],
                       request: Request) -> GenerationResult:
        kind, value = first
        while kind == "delta":
            kind, value = await self._next(job, request)
        if kind == "error":
            raise as_api_error(value)
        return value

    async def _stream(self, job: Job, first: tuple[str, Any],
                      include_usage: bool) -> AsyncIterator[str]:
        head: dict[str, Any] = {"id": _completion_id(), "created": int(time.time()),
                                "model": self.config.model_name}

        def chunk(**fields: Any) -> str:
            return f"data: {ChatCompletionChunk(**head, **fields).model_dump_json()}\n\n"

        try:
            yield chunk(choices=[ChunkChoice(delta=Delta(role="assistant", content=""))])
            kind, value = first
            while kind == "delta":
                yield chunk(choices=[ChunkChoice(delta=Delta(content=value))])
                # Starlette cancels this generator when the client disconnects: no polling
                kind, value = await self._next(job, None)
            if kind == "error":
                raise as_api_error(value)
            self.metrics.observe(value.stats, queue_wait(job))
            yield chunk(choices=[ChunkChoice(delta=Delta(), finish_reason=value.finish_reason)])
            if include_usage:
                yield chunk(choices=[], usage=usage(value, queue_wait(job)))
        except APIError as e:  # the status is already sent: report it in the stream
            self.metrics.error(e)
            yield f"data: {json.dumps(e.body())}\n\n"
        finally:
            self.worker.cancel(job)
        yield "data: [DONE]\n\n"


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


def usage(result: GenerationResult, queue_s: float) -> Usage:
    """OpenAI usage plus the `vlcache` block, from the engine's stats."""
    s = result.stats
    return Usage(
        prompt_tokens=s.prompt_tokens, completion_tokens=s.completion_tokens,
        total_tokens=s.prompt_tokens + s.completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=s.cached_tokens),
        vlcache=CacheUsage(
            policy=s.policy, images=s.images, images_hit=s.images_hit,
            images_missed=s.images_missed, images_kv_reused=s.images_kv_reused,
            image_tokens=s.image_tokens, image_tokens_reused=round(s.image_tokens_reused),
            image_tokens_recomputed=round(s.image_tokens_recomputed, 3),
            documents=s.documents, documents_reused=s.documents_reused,
            text_tokens_reused=round(s.text_tokens_reused),
            ttft_s=round(s.ttft_s, 6), prepare_s=round(s.prepare_s, 6),
            vision_s=round(s.vision_s, 6),
            queue_s=round(queue_s, 6)))


def _completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"
