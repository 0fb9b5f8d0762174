"""The chat endpoint through the official `openai` client: reuse, exactness, streaming, usage."""

from __future__ import annotations

import httpx
import pytest

from tests.server.conftest import MODEL, ask, client, random_image

GREEDY = {"model": MODEL, "max_tokens": 6, "temperature": 0}


def _two_requests(base_url: str, image) -> list:
    c = client(base_url)
    return [c.chat.completions.create(messages=ask(image, "What is in the picture?",
                                                   system="You are terse."), **GREEDY),
            c.chat.completions.create(messages=ask(image, "Which colours dominate here?",
                                                   system="Answer like a poet."), **GREEDY)]


def test_second_request_reuses_the_image_and_skips_the_vision_tower(serve):
    first, second = _two_requests(serve(), random_image(1))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert first.usage.vlcache["images_missed"] == 1
    assert second.usage.prompt_tokens_details.cached_tokens > 0
    cache = second.usage.vlcache
    assert cache["images_hit"] == 1 and cache["images_missed"] == 0 and cache["vision_s"] == 0
    assert cache["images_kv_reused"] == 1
    assert cache["image_tokens_reused"] == second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cache["image_tokens_recomputed"] < cache["image_tokens"]
    assert cache["ttft_s"] > 0 and cache["policy"] == "static:0.05"


def test_static_1_answers_equal_the_full_policy(serve):
    image = random_image(2)
    full = _two_requests(serve(policy="full"), image)
    static = _two_requests(serve(policy="static:1.0"), image)
    assert [r.choices[0].message.content for r in static] == \
        [r.choices[0].message.content for r in full]
    assert all(r.choices[0].message.content for r in full)
    assert static[1].usage.vlcache["images_hit"] == 1  # vision tower skipped, all recomputed
    assert full[1].usage.vlcache["images_hit"] == 0


@pytest.mark.parametrize("sampling", [{"temperature": 0},
                                      {"temperature": 0.9, "top_p": 0.9, "seed": 11}])
def test_streaming_gives_the_same_text(serve, sampling):
    c = client(serve())
    messages = ask(random_image(3), "Describe it.")
    whole = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, **sampling)
    chunks = list(c.chat.completions.create(model=MODEL, messages=messages, max_tokens=12,
                                            stream=True, stream_options={"include_usage": True},
                                            **sampling))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finish[-1] == whole.choices[0].finish_reason and not any(finish[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(ch.usage is None for ch in chunks[:-1])


def test_stream_without_usage_and_raw_sse_format(serve):
    base = serve()
    body = {"model": MODEL, "messages": ask(None, "Hi"), "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]" and '"usage":null' in events[-2]


def test_max_completion_tokens_stop_and_string_content(serve):
    c = client(serve())
    messages = [{"role": "user", "content": "Count to ten."}]
    long = c.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                     max_completion_tokens=8)
    assert long.usage.completion_tokens == 8 and long.choices[0].finish_reason == "length"
    text = long.choices[0].message.content
    stop = text[3:5]
    cut = c.chat.completions.create(model=MODEL, messages=messages, temperature=0,
                                    max_tokens=8, stop=stop)
    assert cut.choices[0].finish_reason == "stop"
    assert text.startswith(cut.choices[0].message.content) and stop not in \
        cut.choices[0].message.content


def test_models_health_metrics(serve):
    base = serve()
    assert [m.id for m in client(base).models.list()] == [MODEL]
    health = httpx.get(f"{base}/health").json()
    assert health["status"] == "ok" and health["queue_depth"] == 0
    metrics = httpx.get(f"{base}/metrics")
    assert metrics.status_code == 200 and "vlcache_queue_depth 0.0" in metrics.text
    assert "vlcache_store_bytes" in metrics.text


def test_text_part_marked_cache_is_a_reusable_document(serve):
    c = client(serve())
    doc = {"type": "text", "text": "The river Omblen flows through Tarsk.", "cache": True}
    first = c.chat.completions.create(messages=[
        {"role": "user", "content": [doc, {"type": "text", "text": " Summarize."}]}], **GREEDY)
    second = c.chat.completions.create(messages=[
        {"role": "system", "content": "Another context."},
        {"role": "user", "content": [{"type": "text", "text": "Where? "}, doc]}], **GREEDY)
    assert first.usage.vlcache["documents"] == 1 and first.usage.vlcache["documents_reused"] == 0
    assert second.usage.vlcache["documents_reused"] == 1
    assert second.usage.prompt_tokens_details.cached_tokens == \
        second.usage.vlcache["text_tokens_reused"] > 0
