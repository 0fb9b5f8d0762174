"""The OpenAI-compatible HTTP server (optional: needs the `server` extra).

    config.py       ServerConfig: queue, timeout, limits, media rules, API key, CORS
    app.py          create_app(engine, config): routes, middleware, worker and recounter lifetime
    serving.py      what both endpoints share: job in, JSON answer or SSE chunks out
    chat.py         POST /v1/chat/completions: budgets and media, chat answer shapes
    completions.py  POST /v1/completions: one prompt string, text_completion shapes
    schemas.py      the OpenAI wire format as pydantic models; refused parameters
    media.py        image URLs -> bytes (data:, allowed local files, opt-in http(s))
    worker.py       the bounded queue and the one thread that runs the engine
    metrics.py      Prometheus metrics in a per-app registry (never waits on the store)
    middleware.py   API key; body-size limit; answers counted by status
    errors.py       OpenAI-style error bodies and the handlers that produce them
"""

from __future__ import annotations

from typing import Any

from vlcache.server.config import ServerConfig

__all__ = ["ServerConfig", "create_app"]


def __getattr__(name: str) -> Any:  # FastAPI is imported only when an app is made
    if name == "create_app":
        from vlcache.server.app import create_app

        return create_app
    raise AttributeError(name)
