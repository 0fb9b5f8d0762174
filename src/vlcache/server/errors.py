"""OpenAI-style errors: one exception type, one body shape, handlers for everything else.

Status rules: 400 a request the server refuses (bad media, a limit crossed, unparsable JSON, a
parameter it cannot honour), 401 a missing or wrong API key, 404 an unknown model or route, 413
too many bytes or pixels, 422 a body that does not match the schema, 503 a full queue, 504 the
request timeout, 500 a bug. Every error carries a non-null `code`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from vlcache.engine.limits import RequestError
from vlcache.server.schemas import REFUSALS

log = logging.getLogger("vlcache.server")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


class APIError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}` with `status`."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        message = _printable(message)
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code or ("invalid_request" if status < 500 else "internal_error")
        self.type = type or (INVALID_REQUEST if status < 500 else SERVER_ERROR)
        self.headers = dict(headers or {})

    @classmethod
    def from_request_error(cls, e: RequestError) -> APIError:
        return cls(e.status, str(e), param=e.param, code=e.code)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def as_api_error(e: BaseException) -> APIError:
    """Any exception from a request's processing as the error its client should see."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, RequestError):
        return APIError.from_request_error(e)
    log.error("request failed", exc_info=e)
    return APIError(500, f"internal error: {type(e).__name__}", code="internal_error")


def _printable(text: str) -> str:
    """Lone surrogates escaped: an answer's JSON must encode as UTF-8."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def param_path(loc: Sequence[str | int]) -> str | None:
    """('body', 'messages', 0, 'content', 1, 'type') -> 'messages[0].content[1].type'."""
    out = ""
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}" if out else str(part)
    return out or None


def validation_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """The first schema violation, named by its JSON path: 422, or 400 for unparsable JSON and
    for a parameter the server cannot honour."""
    first = errors[0] if errors else {"loc": (), "msg": "invalid request", "type": ""}
    kind = first.get("type")
    if kind == "json_invalid":
        return APIError(400, f"the body is not valid JSON ({first.get('msg')})",
                        code="invalid_json")
    if kind == "missing" and tuple(first.get("loc", ())) == ("body",):
        return APIError(400, "the request needs a JSON object as its body", code="invalid_json")
    param = param_path(first.get("loc", ()))
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    if kind in REFUSALS:  # the body is well formed; the server will not do what it asks
        return APIError(400, f"{param}: {msg}", param=param, code=kind)
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return APIError(422, f"{param}: {msg}{more}" if param else msg + more, param=param,
                    code="invalid_value")


def install_handlers(app: FastAPI, on_error: Callable[[APIError], None]) -> None:
    """Every error the app answers goes through `on_error` (metrics) and gets the OpenAI body."""

    def respond(e: APIError) -> JSONResponse:
        on_error(e)
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    async def api_error(_: Request, e: Exception) -> JSONResponse:
        return respond(as_api_error(e))

    async def invalid(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, RequestValidationError)
        return respond(validation_error(e.errors()))

    async def http_error(_: Request, e: Exception) -> JSONResponse:
        assert isinstance(e, HTTPException)
        code = {400: "invalid_json",  # FastAPI's only 400: a body it cannot parse
                404: "not_found", 405: "method_not_allowed",
                413: "request_too_large"}.get(e.status_code)
        return respond(APIError(e.status_code, str(e.detail), code=code,
                                headers=e.headers))

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestError, api_error)
    app.add_exception_handler(RequestValidationError, invalid)
    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, api_error)
