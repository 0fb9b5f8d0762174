"""The FastAPI application: routes, middleware, error handlers, and the lifetimes of the model
worker and the store's recounter."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

import vlcache
from vlcache.engine import Engine
from vlcache.server.chat import ChatCompletions
from vlcache.server.completions import Completions
from vlcache.server.config import ServerConfig
from vlcache.server.errors import install_handlers
from vlcache.server.media import MediaResolver
from vlcache.server.metrics import Metrics
from vlcache.server.middleware import ApiKey, BodyLimit, Cors, CountRequests
from vlcache.server.schemas import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from vlcache.server.serving import Serving
from vlcache.server.worker import ModelWorker
from vlcache.stores.recount import Recounter


def create_app(engine: Engine, config: ServerConfig) -> FastAPI:
    """An OpenAI-compatible app serving `engine`; its model worker runs while the app does."""
    worker = ModelWorker(engine, config.max_queue)
    recounter = Recounter(engine.store, config.store_recount_s)
    metrics = Metrics(engine.store, lambda: worker.depth, lambda: worker.busy)
    media = MediaResolver(config.allowed_local_media_path, config.allow_remote_media,
                          config.remote_media_timeout_s, config.max_media_bytes)
    serving = Serving(config, worker, metrics)
    chat, completions = ChatCompletions(serving, media), Completions(serving)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        worker.start()
        recounter.start()
        yield
        await asyncio.to_thread(recounter.stop)
        await asyncio.to_thread(worker.stop)

    app = FastAPI(title="vlcache", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine, app.state.config = engine, config
    app.state.worker, app.state.metrics = worker, metrics
    install_handlers(app, metrics.error)
    _add_middleware(app, config, metrics)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        return await chat(body, request)

    @app.post("/v1/completions", response_model=None)
    async def text_completions(body: CompletionRequest, request: Request) -> Response:
        return await completions(body, request)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=config.model_name, created=started)])

    @app.get("/health")
    async def health() -> JSONResponse:
        ok = worker.alive
        return JSONResponse({"status": "ok" if ok else "unavailable",
                             "model": config.model_name, "queue_depth": worker.depth,
                             "busy": worker.busy}, status_code=200 if ok else 503)

    @app.get("/version")
    async def version() -> JSONResponse:
        return JSONResponse({"version": vlcache.__version__})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    return app


def _add_middleware(app: FastAPI, config: ServerConfig, metrics: Metrics) -> None:
    """Innermost first: body limit, API key, CORS (so that preflights and 401s get its
    headers), and outermost the counting of every answer by status."""
    app.add_middleware(BodyLimit, limit=config.max_body_bytes)
    if config.api_key is not None:
        app.add_middleware(ApiKey, key=config.api_key, on_error=metrics.error)
    if config.allowed_origins:
        app.add_middleware(Cors, allow_origins=list(config.allowed_origins),
                           allow_methods=list(config.allowed_methods),
                           allow_headers=list(config.allowed_headers),
                           allow_credentials=config.allow_credentials)
    app.add_middleware(CountRequests, record=metrics.request)
