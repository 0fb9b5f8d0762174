"""Image URLs: data: URLs, local files, and http(s) downloads when enabled (from a loopback
HTTP server started here)."""

from __future__ import annotations

import asyncio
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.server.conftest import MODEL, ask, client, png_bytes, random_image
from vlcache.server.errors import APIError
from vlcache.server.media import MediaResolver

IMAGE = png_bytes(random_image(30))


class _Images(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server interface
        if self.path == "/slow.png":
            time.sleep(3.0)
        if self.path not in ("/cat.png", "/big.png", "/slow.png"):
            self.send_error(404)
            return
        body = IMAGE * 100 if self.path == "/big.png" else IMAGE
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(scope="module")
def remote():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _load(resolver: MediaResolver, url: str) -> bytes:
    return asyncio.run(resolver.load(url, "img"))


def _error(resolver: MediaResolver, url: str) -> APIError:
    with pytest.raises(APIError) as info:
        _load(resolver, url)
    return info.value


def test_downloads(remote):
    # a generous timeout where the answer is not a timeout (a loaded machine answers late)
    media = MediaResolver(None, allow_remote=True, timeout_s=2.0, max_bytes=len(IMAGE) * 10)
    assert _load(media, f"{remote}/cat.png") == IMAGE
    assert (_error(media, f"{remote}/big.png").status, _error(media, f"{remote}/big.png").code) \
        == (413, "media_too_large")
    assert _error(media, f"{remote}/missing.png").code == "remote_media_error"
    assert _error(media, "http://127.0.0.1:9/x.png").code == "remote_media_error"
    impatient = MediaResolver(None, allow_remote=True, timeout_s=0.3, max_bytes=len(IMAGE) * 10)
    assert _error(impatient, f"{remote}/slow.png").code == "remote_media_timeout"  # 3 s answer


def test_data_urls_and_schemes():
    media = MediaResolver(None, allow_remote=False, timeout_s=1, max_bytes=100)
    assert _load(media, "data:image/png;base64,aGVs\nbG8=") == b"hello"  # line breaks allowed
    assert _error(media, "data:image/png,hello").code == "invalid_image_url"
    assert _error(media, "ftp://host/x.png").code == "invalid_image_url"
    assert _error(media, "x.png").code == "local_media_disabled"


def test_local_file_size_cap(tmp_path):
    (tmp_path / "big.png").write_bytes(IMAGE)
    media = MediaResolver(tmp_path, allow_remote=False, timeout_s=1, max_bytes=10)
    assert _error(media, "big.png").status == 413


def test_remote_image_through_the_server(serve, remote):
    base = serve(allow_remote_media=True)
    answer = client(base).chat.completions.create(
        model=MODEL, messages=ask(f"{remote}/cat.png", "What is it?"), max_tokens=2)
    assert answer.usage.vlcache["images"] == 1
