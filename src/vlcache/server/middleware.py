"""Two ASGI middlewares: the request-body size limit, and counting answers by status."""

from __future__ import annotations

from collections.abc import Callable

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


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
