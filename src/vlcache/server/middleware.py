"""ASGI middlewares: CORS refusals in the OpenAI error shape, the API key, the request-body size
limit, and counting answers by status."""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vlcache.server.errors import APIError


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body exceeds the limit of {limit} bytes")


class BodyLimit:
    """Fails the app's read of a body over `limit` bytes with a 413 `HTTPException`.

    Starlette's own limiter answers in plain text; this one leaves the answer to the app's
    handlers, so the client gets the OpenAI error body. uvicorn reads and drops the rest of the
    body, so a client still writing gets the answer rather than a reset connection.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        seen = int(declared) if declared.isdigit() else 0

        async def limited() -> Message:
            nonlocal seen
            if seen > self.limit:
                raise BodyTooLarge(self.limit)  # FastAPI passes HTTPExceptions through
            message = await receive()
            if not declared.isdigit():
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, limited, send)


class Cors(CORSMiddleware):
    """Starlette's CORS, with a refused preflight answered as an OpenAI-style error."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        e = APIError(response.status_code, bytes(response.body).decode(), code="cors_rejected")
        headers = {k: v for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "content-type")}
        return JSONResponse(e.body(), status_code=e.status, headers=headers)


class ApiKey:
    """Answers 401 to a request under `/v1` that lacks `Authorization: Bearer <key>`, before its
    body is read. Other paths (/health, /metrics, /version) stay open, as in vLLM."""

    PROTECTED = "/v1"

    def __init__(self, app: ASGIApp, key: str, on_error: Callable[[APIError], None]) -> None:
        self.app = app
        self.key = key.encode()
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _under(scope["path"], self.PROTECTED) or \
                self._allowed(dict(scope["headers"]).get(b"authorization", b"")):
            await self.app(scope, receive, send)
            return
        e = APIError(401, "a valid API key is needed: send 'Authorization: Bearer <key>'",
                     code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        self.on_error(e)
        await JSONResponse(e.body(), status_code=e.status, headers=e.headers)(scope, receive,
                                                                               send)

    def _allowed(self, header: bytes) -> bool:
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


class CountRequests:
    """Counts every HTTP answer by path and status, whatever produced it."""

    def __init__(self, app: ASGIApp, record: Callable[[str, int], None]) -> None:
        self.app = app
        self.record = record

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception before any answer ends in the server's 500

        async def watched(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            self.record(scope["path"], status)
