"""What the generation endpoints share: the model check, sampling, the job in the worker's queue,
and its events turned into one JSON answer or a stream of server-sent events.

The endpoints (chat.py, completions.py) differ only in how they read a request and in the shape
of their answers, which they hand over as an `AnswerShape`.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel

from vlcache.engine import GenerationResult, Limits
from vlcache.engine.request import Messages
from vlcache.server.config import ServerConfig
from vlcache.server.errors import APIError, as_api_error
from vlcache.server.metrics import Metrics
from vlcache.server.schemas import CacheUsage, GenerationRequest, PromptTokensDetails, Usage
from vlcache.server.worker import Job, ModelWorker, QueueFull, queue_wait

POLL_S = 0.25  # how often a request waiting for its first token checks for a disconnect
CLIENT_CLOSED = 499  # nginx's status for "the client went away"; only the metrics see it


class ClientGone(Exception):
    """The client disconnected before its answer started."""


class AnswerShape(Protocol):
    """One endpoint's wire shapes; `head` is the id, created time and model of the answer."""

    def answer(self, head: dict[str, Any], result: GenerationResult, usage: Usage) -> BaseModel: ...

    def opening(self, head: dict[str, Any]) -> BaseModel | None: ...

    def delta(self, head: dict[str, Any], text: str) -> BaseModel: ...

    def finish(self, head: dict[str, Any], reason: str) -> BaseModel: ...

    def usage(self, head: dict[str, Any], usage: Usage) -> BaseModel: ...


class Serving:
    """Runs a request's engine input through the worker and answers in the endpoint's shape."""

    def __init__(self, config: ServerConfig, worker: ModelWorker, metrics: Metrics) -> None:
        self.config = config
        self.worker = worker
        self.metrics = metrics

    @property
    def limits(self) -> Limits:
        return self.worker.engine.limits

    def check_model(self, body: GenerationRequest) -> None:
        if body.model is not None and body.model != self.config.model_name:
            raise APIError(404, f"model {body.model!r} is not served here (this server "
                           f"serves {self.config.model_name!r})", param="model",
                           code="model_not_found")

    def sampling(self, body: GenerationRequest, max_tokens: int | None,
                 param: str) -> dict[str, Any]:
        max_tokens = max_tokens or self.config.default_max_tokens
        if max_tokens > self.config.max_tokens_limit:
            raise APIError(400, f"{param}: {max_tokens} exceeds this server's limit of "
                           f"{self.config.max_tokens_limit}", param=param,
                           code="max_tokens_too_large")
        return {"max_tokens": max_tokens,
                "temperature": 1.0 if body.temperature is None else body.temperature,
                "top_p": 1.0 if body.top_p is None else body.top_p,
                "stop": tuple(body.stop or ()), "seed": body.seed}

    async def run(self, body: GenerationRequest, messages: Messages, sampling: dict[str, Any],
                  deadline: float, request: Request, shape: AnswerShape,
                  id_prefix: str) -> Response:
        """Queue the job; answer with the whole result, or stream it as it comes."""
        job = Job(messages, sampling, asyncio.get_running_loop(), deadline=deadline)
        try:
            self.worker.submit(job)
        except QueueFull as e:
            raise APIError(503, f"the server is busy ({self.worker.max_queue} requests "
                           "queued); retry later", code="queue_full",
                           headers={"Retry-After": str(e.retry_after)}) from None
        head = {"id": f"{id_prefix}-{uuid.uuid4().hex}", "created": int(time.time()),
                "model": self.config.model_name}
        try:
            first = await self._next(job, request)
            if first[0] == "error":  # a bad request fails before its first token
                raise as_api_error(first[1])
            if body.stream:  # the stream's own cleanup cancels the job from here on
                return StreamingResponse(self._stream(job, first, shape, head,
                                                      body.include_usage),
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
        answer = shape.answer(head, result, usage(result, queue_wait(job)))
        return JSONResponse(answer.model_dump(mode="json"))

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

    async def _stream(self, job: Job, first: tuple[str, Any], shape: AnswerShape,
                      head: dict[str, Any], include_usage: bool) -> AsyncIterator[str]:
        def event(chunk: BaseModel) -> str:
            return f"data: {chunk.model_dump_json()}\n\n"

        try:
            opening = shape.opening(head)
            if opening is not None:
                yield event(opening)
            kind, value = first
            while kind == "delta":
                yield event(shape.delta(head, value))
                # Starlette cancels this generator when the client disconnects: no polling
                kind, value = await self._next(job, None)
            if kind == "error":
                raise as_api_error(value)
            self.metrics.observe(value.stats, queue_wait(job))
            yield event(shape.finish(head, value.finish_reason))
            if include_usage:
                yield event(shape.usage(head, usage(value, queue_wait(job))))
        except APIError as e:  # the status is already sent: report it in the stream
            self.metrics.error(e)
            yield f"data: {json.dumps(e.body())}\n\n"
        finally:
            self.worker.cancel(job)
        yield "data: [DONE]\n\n"


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
