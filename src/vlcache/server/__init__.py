"""The OpenAI-compatible HTTP server (optional: needs the `server` extra).

    config.py       ServerConfig: queue, timeout, body and max_tokens limits, media rules
    app.py          create_app(engine, config): routes, middleware, worker lifetime
    completions.py  POST /v1/chat/completions: job in, JSON answer or SSE chunks out
    schemas.py      the OpenAI wire format as pydantic models
    media.py        image URLs -> bytes (data:, allowed local files, opt-in http(s))
    worker.py       the bounded queue and the one thread that runs the engine
    metrics.py      Prometheus metrics in a per-app registry
    middleware.py   body-size limit; answers counted by status
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
