"""Every kind of bad request gets its OpenAI-style error, and the server keeps serving."""

from __future__ import annotations

import base64

import httpx
import openai
import pytest
from PIL import Image

from tests.engine.test_image_limits import png_header_only
from tests.server.conftest import MODEL, ask, client, data_url, live_server, random_image
from vlcache.engine import Engine, Limits
from vlcache.server import ServerConfig


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("media")
    (root / "allowed").mkdir()
    (root / "outside").mkdir()
    random_image(5).save(root / "allowed" / "ok.png")
    random_image(6).save(root / "outside" / "secret.png")
    (root / "allowed" / "link.png").symlink_to(root / "outside" / "secret.png")
    return root


@pytest.fixture(scope="module")
def base(checkpoint, media):
    engine = Engine.from_pretrained(checkpoint, limits=Limits(max_image_pixels=200 * 200,
                                                              max_images=2,
                                                              max_prompt_tokens=400))
    config = ServerConfig(MODEL, allowed_local_media_path=media / "allowed",
                          default_max_tokens=16, max_tokens_limit=64,
                          max_body_bytes=8 * 2**20)
    with live_server(engine, config) as url:
        yield url


def _image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _user(*parts: dict) -> list[dict]:
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "What is this?"}]}]


TEXT_AS_PNG = base64.b64encode(b"I am a text file, honestly.\n").decode()
BAD = {
    "broken-base64": (_user(_image_part("data:image/png;base64,iVBORw0K!!not*base64")), {},
                      400, "invalid_base64", "messages[0].content[0]"),
    "text-posing-as-png": (_user(_image_part(f"data:image/png;base64,{TEXT_AS_PNG}")), {},
                           400, "invalid_image", "messages[0].content[0]"),
    "not-an-image-type": (_user(_image_part(f"data:text/plain;base64,{TEXT_AS_PNG}")), {},
                          400, "invalid_image_url", "messages[0].content[0]"),
    "one-pixel": (_user(_image_part(data_url(Image.new("RGB", (1, 1))))), {},
                  400, "image_too_small", "messages[0].content[0]"),
    "over-pixel-limit": (_user(_image_part(data_url(random_image(7, 300, 300)))), {},
                         413, "image_too_large", "messages[0].content[0]"),
    "decompression-bomb": (_user(_image_part(data_url(png_header_only(30_000, 30_000)))), {},
                           413, "image_too_large", "messages[0].content[0]"),
    "path-outside": (_user(_image_part("../outside/secret.png")), {},
                     400, "media_path_not_allowed", "messages[0].content[0]"),
    "symlink-outside": (_user(_image_part("link.png")), {},
                        400, "media_path_not_allowed", "messages[0].content[0]"),
    "file-url-outside": (_user(_image_part("file:///etc/passwd")), {},
                         400, "media_path_not_allowed", "messages[0].content[0]"),
    "missing-file": (_user(_image_part("nope.png")), {},
                     400, "media_not_found", "messages[0].content[0]"),
    "remote-disabled": (_user(_image_part("https://example.com/cat.png")), {},
                        400, "remote_media_disabled", "messages[0].content[0]"),
    "unknown-part-type": (_user({"type": "input_audio", "input_audio": {"data": ""}}), {},
                          422, "invalid_value", "messages[0].content[0].type"),
    "part-without-its-field": (_user({"type": "image_url"}), {},
                               422, "invalid_value", "messages[0].content[0]"),
    "empty-messages": ([], {}, 422, "invalid_value", "messages"),
    "unknown-role": ([{"role": "wizard", "content": "hi"}], {},
                     422, "invalid_value", "messages[0].role"),
    "too-many-images": (_user(*[_image_part(data_url(random_image(8)))] * 3), {},
                        400, "invalid_request", "messages"),
    "prompt-too-long": ([{"role": "user", "content": "x" * 500}], {},
                        400, "context_length_exceeded", "messages"),
    "max-tokens-zero": (ask(None, "hi"), {"max_tokens": 0}, 422, "invalid_value", "max_tokens"),
    "max-tokens-negative": (ask(None, "hi"), {"max_completion_tokens": -5},
                            422, "invalid_value", "max_completion_tokens"),
    "max-tokens-huge": (ask(None, "hi"), {"max_tokens": 10**9},
                        400, "max_tokens_too_large", "max_tokens"),
    "temperature": (ask(None, "hi"), {"temperature": 7}, 422, "invalid_value", "temperature"),
    "n-2": (ask(None, "hi"), {"n": 2}, 400, "unsupported_parameter", "n"),
    "unknown-model": (ask(None, "hi"), {"model": "gpt-9"}, 404, "model_not_found", "model"),
}


def _healthy(base: str) -> None:
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    ok = client(base).chat.completions.create(model=MODEL, messages=ask(random_image(9), "Hi"),
                                              max_tokens=2, temperature=0)
    assert ok.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("case", list(BAD))
def test_bad_request_gets_its_error(base, case):
    messages, extra, status, code, param = BAD[case]
    with pytest.raises(openai.APIStatusError) as info:
        client(base).chat.completions.create(**{"model": MODEL, "messages": messages,
                                                "max_tokens": 2, **extra})
    assert info.value.status_code == status
    error = info.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param), error
    assert error["type"] == "invalid_request_error" and error["message"]
    _healthy(base)


def test_fifty_megabyte_body(base):
    huge = [{"role": "user", "content": "x" * 50_000_000}]
    with pytest.raises(openai.APIStatusError) as info:
        client(base).chat.completions.create(model=MODEL, messages=huge, max_tokens=2)
    assert info.value.status_code == 413
    assert info.value.response.json()["error"]["code"] == "request_too_large"
    _healthy(base)


@pytest.mark.parametrize("content,status,code", [
    (b"{not json", 400, "invalid_json"),
    (b'{"messages": "hello"}', 422, "invalid_value"),
])
def test_malformed_body(base, content, status, code):
    r = httpx.post(f"{base}/v1/chat/completions", content=content,
                   headers={"content-type": "application/json"})
    assert r.status_code == status and r.json()["error"]["code"] == code
    _healthy(base)


def test_unknown_route_and_method(base):
    assert httpx.get(f"{base}/v1/nothing").json()["error"]["code"] == "not_found"
    r = httpx.get(f"{base}/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


def test_allowed_local_file_and_file_url(base, media):
    c = client(base)
    for url in ("ok.png", f"file://{media / 'allowed' / 'ok.png'}"):
        r = c.chat.completions.create(model=MODEL, messages=_user(_image_part(url)),
                                      max_tokens=2, temperature=0)
        assert r.usage.vlcache["images"] == 1
