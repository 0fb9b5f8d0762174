"""What a hostile client found (issue 22): every case a clean 4xx with an OpenAI-style error whose
`code` is set, never a 500, and the server answering the next request as before."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.engine.test_image_limits import png_header_only
from tests.server.conftest import MODEL, ask, client, data_url, live_server, random_image
from vlcache.engine import Engine, Limits
from vlcache.server import ServerConfig

LIMITS = Limits(max_images=4, max_image_pixels=4_000_000, max_total_image_pixels=3_000_000,
                max_total_image_tokens=300, max_prompt_tokens=2_000)


@pytest.fixture(scope="module")
def media(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-media")
    random_image(5).save(root / "ok.png")
    return root


@pytest.fixture(scope="module")
def base(checkpoint, media):
    engine = Engine.from_pretrained(checkpoint, limits=LIMITS)
    config = ServerConfig(MODEL, allowed_local_media_path=media, default_max_tokens=8,
                          max_tokens_limit=64)
    with live_server(engine, config) as url:
        yield url


def _post(base: str, body: dict | bytes, path: str = "/v1/chat/completions",
          **kwargs) -> httpx.Response:
    """POST a body as JSON; a dict is dumped with `ensure_ascii`, so lone surrogates survive
    as `\\ud800` escapes the way a hostile client sends them."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{base}{path}", content=raw, timeout=60,
                      headers={"content-type": "application/json"}, **kwargs)


def _refused(r: httpx.Response, status: int, code: str, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["code"] == code and error["type"] == "invalid_request_error", error
    if param is not None:
        assert error["param"] == param, error
    return error


def _user(*parts: dict) -> dict:
    return {"model": MODEL, "max_tokens": 2,
            "messages": [{"role": "user", "content": [*parts, {"type": "text", "text": "?"}]}]}


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def _still_serving(base: str) -> None:
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    r = _post(base, {"model": MODEL, "messages": ask(random_image(9), "Hi"), "max_tokens": 2})
    assert r.status_code == 200, r.text


# --- 1. local media paths ----------------------------------------------------------------------

@pytest.mark.parametrize("url,status,code", [
    ("a\u0000.png", 400, "invalid_image_url"),
    ("file:///tmp/a%00.png", 400, "invalid_image_url"),
    ("x" * 5_000, 400, "invalid_image_url"),
    ("d" * 300 + ".png", 400, "media_not_found"),  # a name too long for the file system
    ("sub/" + "e" * 300 + "/f.png", 400, "media_not_found"),
    ("a\ud800.png", 422, "invalid_value"),  # pydantic cannot read the URL string
    ("file:///tmp/%ED%A0%80.png", 400, "media_path_not_allowed"),
])
def test_unusable_local_path_is_a_4xx(base, url, status, code):
    error = _refused(_post(base, _user(_image(url))), status, code)
    assert error["param"].startswith("messages[0].content[0]")
    assert "\x00" not in error["message"]
    _still_serving(base)


# --- 2. lone surrogates ----------------------------------------------------------------------

@pytest.mark.parametrize("where,body", [
    ("messages[0].content[0]", {"messages": [{"role": "user", "content": "a\ud800b"}]}),
    ("messages[0].content[0]", _user({"type": "text", "text": "x\udfff"})),
    ("messages[0].content[0]", _user({"type": "text", "text": "doc \ud800", "cache": True})),
    ("messages[1].content[0]", {"messages": [{"role": "system", "content": "ok"},
                                          {"role": "user", "content": "\udc80"}]}),
])
def test_lone_surrogate_is_a_400(base, where, body):
    _refused(_post(base, {"model": MODEL, "max_tokens": 2, **body}), 400, "invalid_text", where)
    _still_serving(base)


def test_lone_surrogate_in_a_completion_prompt(base):
    r = _post(base, {"prompt": "a\ud800", "max_tokens": 2}, path="/v1/completions")
    _refused(r, 400, "invalid_text", "prompt")


def test_lone_surrogate_echoed_in_an_error_is_escaped(base):
    r = _post(base, {"model": "m\ud800", "messages": [{"role": "user", "content": "hi"}]})
    assert "\\ud800" in _refused(r, 404, "model_not_found", "model")["message"]


# --- 3. empty stop strings ---------------------------------------------------------------------

@pytest.mark.parametrize("stop", ["", [""], ["end", ""]])
def test_empty_stop_string_is_refused(base, stop):
    body = {"model": MODEL, "messages": ask(None, "hi"), "stop": stop, "stream": True}
    _refused(_post(base, body), 422, "invalid_value", "stop")


# --- 5. budgets before the work ----------------------------------------------------------------

def _small_request_time(base: str) -> float:
    t = time.perf_counter()
    r = _post(base, {"model": MODEL, "messages": ask(None, "hi"), "max_tokens": 4,
                     "temperature": 0})
    assert r.status_code == 200
    return time.perf_counter() - t


@pytest.mark.parametrize("body", [
    {"model": MODEL, "messages": [{"role": "user", "content": "x" * 10_000_000}]},
    {"model": MODEL, "messages": [{"role": "user", "content": "a"}] * 300_000},
], ids=["10-MB-prompt", "300k-messages"])
def test_huge_prompt_is_refused_without_delaying_others(base, body):
    normal = min(_small_request_time(base) for _ in range(3))
    raw = json.dumps(body).encode()
    answer: dict[str, httpx.Response] = {}
    big = threading.Thread(target=lambda: answer.update(r=_post(base, raw)))
    big.start()
    time.sleep(0.02)  # the big body is on its way
    small = _small_request_time(base)
    big.join(60)
    error = answer["r"].json()["error"]
    assert answer["r"].status_code == 400, error
    assert error["code"] in ("context_length_exceeded", "too_many_messages")
    assert small < normal + 1.0, f"{small:.2f} s behind the big request, {normal:.2f} s alone"


def test_character_budget_names_the_limit(base):
    r = _post(base, {"model": MODEL, "messages": ask(None, "y" * 16_001)})
    error = _refused(r, 400, "context_length_exceeded", "messages")
    assert "16000" in error["message"] and "max_prompt_chars" in error["message"]


def test_too_many_content_parts(base):
    parts = [{"type": "text", "text": "a"}] * 5_000
    r = _post(base, {"model": MODEL, "messages": [{"role": "user", "content": parts}]})
    _refused(r, 400, "too_many_content_parts", "messages")


# --- 6. per-request totals, checked on the image headers before any decoding ---------------------

def test_total_pixels_refused_before_decoding(base):
    # header-only PNGs: decoding them would fail with invalid_image
    parts = [_image(data_url(png_header_only(1600, 1000))) for _ in range(2)]
    error = _refused(_post(base, _user(*parts)), 413, "image_pixels_exceeded", "messages")
    assert "3000000" in error["message"] and "max_total_image_pixels" in error["message"]


def test_total_image_tokens_refused_before_decoding(base):
    error = _refused(_post(base, _user(_image(data_url(png_header_only(1000, 1000))))), 400,
                     "image_tokens_exceeded", "messages")
    assert "max_total_image_tokens" in error["message"]


def test_images_within_the_totals_are_served(base):
    r = _post(base, _user(_image(data_url(random_image(4))), _image(data_url(random_image(5)))))
    assert r.status_code == 200 and r.json()["usage"]["vlcache"]["images"] == 2


# --- 8. smaller ones ---------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}',  # not UTF-8
    b"",
    b"[" * 100_000,
])
def test_body_parse_errors_are_invalid_json(base, raw):
    _refused(_post(base, raw), 400, "invalid_json")


@pytest.mark.parametrize("field,value", [("max_tokens", True), ("stream", "yes"),
                                         ("max_completion_tokens", 2.0), ("temperature", True),
                                         ("seed", "7"), ("stream_options", {"include_usage": 1})])
def test_coercions_are_refused(base, field, value):
    r = _post(base, {"model": MODEL, "messages": ask(None, "hi"), field: value})
    assert _refused(r, 422, "invalid_value")["param"].startswith(field)


@pytest.mark.parametrize("sampling", [{"temperature": 1e-300}, {"top_p": 1e-300},
                                      {"temperature": 1e-300, "stream": True},
                                      {"seed": 2**64 - 1}, {"seed": -(2**63)}])
def test_extreme_sampling_values_are_served(base, sampling):
    body = {"model": MODEL, "messages": ask(None, "hi"), "max_tokens": 3, "temperature": 1.0}
    r = _post(base, {**body, **sampling})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("text,path", [("<|image_pad|>", "/v1/chat/completions"),
                                       ("\u0000vlcache-segment\u0000", "/v1/chat/completions"),
                                       ("<|image_pad|>", "/v1/completions"),
                                       ("", "/v1/completions")])
def test_reserved_text_is_a_400(base, text, path):
    body = {"prompt": text} if path == "/v1/completions" else \
        {"messages": [{"role": "user", "content": text}]}
    _refused(_post(base, {"model": MODEL, **body}, path=path), 400, "invalid_request")


def test_no_500_was_answered(base):
    families = text_string_to_metric_families(httpx.get(f"{base}/metrics").text)
    statuses = {s.labels["status"] for f in families if f.name == "vlcache_requests"
                for s in f.samples}
    assert statuses and not any(s.startswith("5") for s in statuses), statuses


@pytest.mark.parametrize("case", ["200-status", "stream"])
def test_openai_client_still_works(base, case):
    c = client(base)
    if case == "stream":
        chunks = list(c.chat.completions.create(model=MODEL, messages=ask(None, "hi"),
                                                max_tokens=3, stream=True))
        assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    else:
        r = c.chat.completions.create(model=MODEL, messages=ask(None, "hi"), max_tokens=3)
        assert r.choices[0].finish_reason in ("stop", "length")
