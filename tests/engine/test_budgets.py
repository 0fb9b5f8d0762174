"""Request budgets are checked before the work they bound: characters before tokenizing, image
headers before decoding, tokens as they are counted (issue 22)."""

from __future__ import annotations

import pytest

from tests.conftest import document, random_image, user
from tests.engine.test_image_limits import png_header_only
from vlcache.engine import Engine, Limits, RequestError
from vlcache.engine.limits import check_text


@pytest.fixture
def engine(tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints["qwen2_5_vl"],
                                  limits=Limits(max_prompt_tokens=300,
                                                max_total_image_pixels=50_000,
                                                max_total_image_tokens=40))


class _Counting:
    """Wraps a tokenizer and records how many characters it was asked to tokenize."""

    def __init__(self, tokenizer) -> None:
        self.inner = tokenizer
        self.chars = 0

    def __call__(self, text, **kwargs):
        self.chars += len(text)
        return self.inner(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_limits_derive_the_character_budget():
    assert Limits(max_prompt_tokens=100).max_prompt_chars == 800
    assert Limits(max_prompt_chars=5).max_prompt_chars == 5
    with pytest.raises(ValueError, match="max_total_image_tokens"):
        Limits(max_total_image_tokens=0)


@pytest.mark.parametrize("messages", [
    [user("z" * 2_401)],
    [user("a", document("z" * 2_400))],
    [{"role": "user", "content": "z"}] * 301,
], ids=["text", "document", "messages"])
def test_text_over_budget_is_refused_before_tokenizing(engine, messages):
    counting = _Counting(engine.builder.tokenizer)
    engine.builder.tokenizer = counting
    with pytest.raises(RequestError) as info:
        engine.prefill(messages)
    assert info.value.code == "context_length_exceeded" and counting.chars == 0


def test_raw_prompt_over_budget_is_refused_before_tokenizing(engine):
    counting = _Counting(engine.builder.tokenizer)
    engine.builder.tokenizer = counting
    with pytest.raises(RequestError) as info:
        engine.prefill("w" * 2_401)
    assert (info.value.code, info.value.param, counting.chars) == \
        ("context_length_exceeded", "prompt", 0)


def test_total_pixels_refused_from_the_headers(engine):
    # header-only PNGs hold no pixels: decoding one would fail with invalid_image
    images = [png_header_only(160, 160), png_header_only(160, 160)]  # 51,200 pixels
    with pytest.raises(RequestError) as info:
        engine.prefill([user(*images, "?")])
    assert (info.value.code, info.value.status) == ("image_pixels_exceeded", 413)
    assert "50000" in str(info.value)


def test_total_image_tokens_refused_from_the_headers(engine):
    with pytest.raises(RequestError) as info:
        engine.prefill([user(png_header_only(200, 200), "?")])
    assert info.value.code == "image_tokens_exceeded" and "40" in str(info.value)


def test_images_within_the_totals_pass(engine):
    run = engine.prefill([user(random_image(41, 56, 56), random_image(42, 56, 56), "?")])
    assert run.stats.images == 2 and run.stats.image_tokens <= 40


def test_tokens_counted_as_they_grow(engine):
    with pytest.raises(RequestError) as info:
        engine.prefill([user("q " * 1_000)])  # within 2,400 characters, over 300 tokens
    assert info.value.code == "context_length_exceeded"


@pytest.mark.parametrize("text", ["a\ud800", "\udfffz", "ok \udc80 ok"])
def test_lone_surrogates_are_request_errors(engine, text):
    with pytest.raises(RequestError) as info:
        check_text(text, "where")
    assert info.value.code == "invalid_text"
    for messages in ([user(text)], [user("x", document(text))], [{"role": "user",
                                                                   "content": text}], text):
        with pytest.raises(RequestError) as info:
            engine.prefill(messages)
        assert info.value.code == "invalid_text"
