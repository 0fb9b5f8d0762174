"""The FastAPI application: routes, middleware, error handlers, and the worker's lifetime."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from vlcache.engine import Engine
from vlcache.server.completions import ChatCompletions
from vlcache.server.config import ServerConfig
from vlcache.server.errors import install_handlers
from vlcache.server.media import MediaResolver
from vlcache.server.metrics import Metrics
from vlcache.server.middleware import BodyLimit, CountRequests
from vlcache.server.schemas import ChatCompletionRequest, ModelCard, ModelList
from vlcache.server.worker import ModelWorker


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """An OpenAI-compatible app serving `engine`; its model worker runs while the app does."""
    worker = ModelWorker(engine, config.max_queue)
    metrics = Metrics(engine.store, lambda: worker.depth, lambda: worker.busy)
    media = MediaResolver(config.allowed_local_media_path, config.allow_remote_media,
                          config.remote_media_timeout_s, config.max_media_bytes)
    chat = ChatCompletions(config, worker, media, metrics)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.start()
        yield
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="vlcache", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine, app.state.config = engine, config
    app.state.worker, app.state.metrics = worker, metrics
    install_handlers(app, metrics.error)
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    app.add_middleware(CountRequests, record=metrics.request)  # outermost: sees every status

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await chat(body, request)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=config.model_name, created=started)])

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = worker.alive
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "model": config.model_name, "queue_depth": worker.depth,
                             "busy": worker.busy}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app
