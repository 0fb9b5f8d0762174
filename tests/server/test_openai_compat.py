"""What a vLLM user expects: /v1/completions, /version, --api-key, CORS, and parameters the engine
cannot honour refused by name rather than ignored (issue 22)."""

from __future__ import annotations

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

import vlcache
from tests.server.conftest import MODEL, ask, client, live_server
from vlcache import cli
from vlcache.engine import Engine
from vlcache.server import ServerConfig

KEY = "sk-test-123"
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    return Engine.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def base(engine):
    with live_server(engine, ServerConfig(MODEL, default_max_tokens=8)) as url:
        yield url


@pytest.fixture(scope="module")
def locked(engine):
    config = ServerConfig(MODEL, api_key=KEY, allowed_origins=(ORIGIN,))
    with live_server(engine, config) as url:
        yield url


# --- /v1/completions ---------------------------------------------------------------------------

def test_completion_is_the_raw_prompt_continued(base, engine):
    c = client(base)
    prompt = "The capital of France is"
    whole = c.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0)
    assert whole.object == "text_completion" and whole.id.startswith("cmpl-")
    assert whole.usage.prompt_tokens == len(engine.tokenizer(prompt)["input_ids"])  # no template
    assert whole.choices[0].finish_reason in ("stop", "length") and whole.choices[0].text
    chunks = list(c.completions.create(model=MODEL, prompt=[prompt], max_tokens=10,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True}))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.choices[0].text
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finish[-1] == whole.choices[0].finish_reason and not any(finish[:-1])
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("extra,param", [
    ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": [1, 2, 3]}, "prompt"),
    ({"prompt": "a", "echo": True}, "echo"), ({"prompt": "a", "logprobs": 2}, "logprobs"),
    ({"prompt": "a", "best_of": 3}, "best_of"), ({"prompt": "a", "suffix": "z"}, "suffix"),
])
def test_completion_parameters_it_cannot_honour(base, extra, param):
    r = httpx.post(f"{base}/v1/completions", json={"model": MODEL, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param
    assert r.json()["error"]["code"] == "unsupported_parameter"


# --- refused chat parameters ---------------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("param,value", [
    ("tools", [TOOL]), ("tool_choice", "required"), ("response_format", {"type": "json_object"}),
    ("presence_penalty", 0.5), ("frequency_penalty", -1), ("top_k", 5), ("min_p", 0.1),
    ("logprobs", True), ("top_logprobs", 3), ("n", 2), ("logit_bias", {"5": 1}),
    ("repetition_penalty", 1.2), ("functions", [TOOL["function"]]),
])
def test_parameter_it_cannot_honour_is_a_400_naming_it(base, param, value):
    r = httpx.post(f"{base}/v1/chat/completions",
                   json={"model": MODEL, "messages": ask(None, "hi"), param: value})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["code"]) == (param, "unsupported_parameter")
    assert param in error["message"]


@pytest.mark.parametrize("neutral", [
    {"tools": []}, {"tool_choice": "none"}, {"response_format": {"type": "text"}},
    {"presence_penalty": 0}, {"frequency_penalty": 0.0}, {"top_k": -1}, {"min_p": 0},
    {"logprobs": False}, {"n": 1}, {"logit_bias": {}}, {"user": "u-1"},
])
def test_neutral_values_are_accepted(base, neutral):
    r = httpx.post(f"{base}/v1/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": ask(None, "hi"), "max_tokens": 2,
                         **neutral})
    assert r.status_code == 200, r.text


def test_version(base):
    assert httpx.get(f"{base}/version").json() == {"version": vlcache.__version__}


# --- API key ------------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}])
def test_v1_needs_the_key(locked, headers):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
                         ("POST", "/v1/completions")):
        r = httpx.request(method, f"{locked}{path}", headers=headers, content=b"{not json")
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] == "invalid_api_key"


def test_the_right_key_and_open_paths(locked):
    c = client(locked, api_key=KEY)
    assert c.chat.completions.create(model=MODEL, messages=ask(None, "hi"), max_tokens=2).usage
    with pytest.raises(openai.AuthenticationError):
        client(locked, api_key="nope").models.list()
    for path in ("/health", "/version", "/metrics"):
        assert httpx.get(f"{locked}{path}").status_code == 200
    text = httpx.get(f"{locked}/metrics").text
    errors = {s.labels["code"]: s.value for f in text_string_to_metric_families(text)
              if f.name == "vlcache_errors" for s in f.samples if s.name.endswith("_total")}
    assert errors.get("invalid_api_key", 0) >= 1


# --- CORS ---------------------------------------------------------------------------------------

def _preflight(base: str, origin: str) -> httpx.Response:
    return httpx.options(f"{base}/v1/chat/completions", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})


def test_cors_for_the_allowed_origin_only(locked):
    ok = _preflight(locked, ORIGIN)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == ORIGIN
    evil = _preflight(locked, "https://evil.example")
    assert evil.status_code == 400 and "access-control-allow-origin" not in evil.headers
    assert evil.json()["error"]["code"] == "cors_rejected"
    r = httpx.get(f"{locked}/v1/models", headers={"Origin": ORIGIN})  # a 401 carries it too
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN


def test_no_cors_headers_by_default(base):
    r = httpx.get(f"{base}/v1/models", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# --- flags --------------------------------------------------------------------------------------

def _serve_config(checkpoint, monkeypatch, *flags: str) -> tuple[ServerConfig, Engine]:
    started = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.update(app=app))
    assert cli.main(["serve", "--model", str(checkpoint), *flags]) == 0
    return started["app"].state.config, started["app"].state.engine


def test_serve_flags(checkpoint, monkeypatch):
    monkeypatch.setenv("VLCACHE_API_KEY", "from-env")
    config, engine = _serve_config(
        checkpoint, monkeypatch, "--allowed-origins", '["https://a.example", "https://b"]',
        "--allowed-methods", "GET,POST", "--max-total-image-pixels", "1000000",
        "--max-total-image-tokens", "512", "--max-prompt-chars", "9999",
        "--store-recount-interval", "5")
    assert config.api_key == "from-env" and "from-env" not in repr(config)
    assert config.allowed_origins == ("https://a.example", "https://b")
    assert config.allowed_methods == ("GET", "POST") and config.store_recount_s == 5
    limits = engine.limits
    assert (limits.max_total_image_pixels, limits.max_total_image_tokens,
            limits.max_prompt_chars) == (1_000_000, 512, 9999)
    config, _ = _serve_config(checkpoint, monkeypatch, "--api-key", "flag")
    assert config.api_key == "flag"
