"""Image URLs to bytes: `data:` URLs, local files under one allowed directory, and (only when
enabled) http(s) downloads with a timeout and a size cap. Decoding is the engine's job."""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx

from vlcache.server.errors import APIError

_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*):")
MAX_PATH_CHARS = 4096  # PATH_MAX on Linux; a longer path can only fail


class MediaResolver:
    """Fetches the bytes behind an `image_url.url`; each refusal is an `APIError` naming `where`."""

    def __init__(self, allowed_local_path: Path | None, allow_remote: bool,
                 timeout_s: float, max_bytes: int) -> None:
        self.allowed_local_path = allowed_local_path
        self.allow_remote = allow_remote
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes

    async def load(self, url: str, where: str) -> bytes:
        match = _SCHEME.match(url[:32])  # not urlsplit: a data URL can be megabytes long
        scheme = match.group(1).lower() if match else ""
        if scheme == "data":  # decoding megabytes of base64 would stall the event loop
            return await asyncio.to_thread(_decode_data_url, url, where)
        if scheme in ("http", "https"):
            return await self._download(url, where)
        if scheme == "file":
            return await self._read_local(unquote(urlsplit(url).path), where)
        if scheme:
            raise APIError(400, f"{where}: unsupported URL scheme {scheme!r} (use data:, a "
                           "local path, or http(s) when enabled)", param=where,
                           code="invalid_image_url")
        return await self._read_local(url, where)

    async def _read_local(self, path: str, where: str) -> bytes:
        root = self.allowed_local_path
        if root is None:
            raise APIError(400, f"{where}: local files are disabled on this server (start it "
                           "with --allowed-local-media-path)", param=where,
                           code="local_media_disabled")
        if "\x00" in path or len(path) > MAX_PATH_CHARS:
            raise APIError(400, f"{where}: not a usable file path (a NUL byte, or over "
                           f"{MAX_PATH_CHARS} characters)", param=where,
                           code="invalid_image_url")
        target = await asyncio.to_thread(_local_file, root, path, where, self.max_bytes)
        return await asyncio.to_thread(target.read_bytes)

    async def _download(self, url: str, where: str) -> bytes:
        if not self.allow_remote:
            raise APIError(400, f"{where}: remote image URLs are disabled on this server "
                           "(start it with --allow-remote-media)", param=where,
                           code="remote_media_disabled")
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=True,
                                         max_redirects=3) as client:
                async with client.stream("GET", url) as response:
                    if response.status_code != 200:
                        raise APIError(400, f"{where}: fetching the image gave HTTP "
                                       f"{response.status_code}", param=where,
                                       code="remote_media_error")
                    return await self._read_capped(response, where)
        except httpx.TimeoutException:
            raise APIError(400, f"{where}: the image did not arrive within "
                           f"{self.timeout_s:g} s", param=where,
                           code="remote_media_timeout") from None
        except httpx.HTTPError as e:
            raise APIError(400, f"{where}: cannot fetch the image ({type(e).__name__})",
                           param=where, code="remote_media_error") from None

    async def _read_capped(self, response: httpx.Response, where: str) -> bytes:
        declared = int(response.headers.get("content-length") or 0)
        if declared > self.max_bytes:
            raise _too_large(where, declared, self.max_bytes)
        data = bytearray()
        async for chunk in response.aiter_bytes():
            data += chunk
            if len(data) > self.max_bytes:
                raise _too_large(where, len(data), self.max_bytes)
        return bytes(data)


def _local_file(root: Path, path: str, where: str, max_bytes: int) -> Path:
    """The file `path` names under `root`, checked (blocking: run it in a thread)."""
    try:
        target = (root / path).resolve()  # follows symlinks: a link out of root is refused
        if not target.is_relative_to(root):
            raise APIError(400, f"{where}: {path!r} is outside the allowed media directory",
                           param=where, code="media_path_not_allowed")
        if not target.is_file():
            raise APIError(400, f"{where}: no such file {path!r}", param=where,
                           code="media_not_found")
        size = target.stat().st_size
    except (OSError, ValueError) as e:  # e.g. a name too long for the file system
        raise APIError(400, f"{where}: cannot open {path[:200]!r} ({type(e).__name__})",
                       param=where, code="media_not_found") from None
    if size > max_bytes:
        raise _too_large(where, size, max_bytes)
    return target


def _decode_data_url(url: str, where: str) -> bytes:
    header, sep, payload = url.partition(",")
    media_type, *params = header[len("data:"):].split(";")
    if not sep or "base64" not in params:
        raise APIError(400, f"{where}: a data URL must look like data:image/png;base64,...",
                       param=where, code="invalid_image_url")
    if not media_type.lower().startswith("image/"):
        raise APIError(400, f"{where}: data URL media type {media_type!r} is not an image",
                       param=where, code="invalid_image_url")
    try:
        return base64.b64decode("".join(payload.split()), validate=True)
    except (binascii.Error, ValueError) as e:
        raise APIError(400, f"{where}: the data URL is not valid base64 ({e})", param=where,
                       code="invalid_base64") from None


def _too_large(where: str, size: int, limit: int) -> APIError:
    return APIError(413, f"{where}: the image file has {size} bytes, over the limit of "
                    f"{limit}", param=where, code="media_too_large")
