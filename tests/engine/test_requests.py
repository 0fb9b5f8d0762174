"""Keys, bad input, sampling and streaming at the request level."""

from __future__ import annotations

import io
import json
import shutil

import pytest
import torch

from tests.conftest import random_image, user
from vlcache.engine import Engine, Limits, RequestError
from vlcache.engine.sampling import SamplingParams, sample
from vlcache.models.loading import ModelLoadError
from vlcache.models.synthetic import build_image_processor


@pytest.fixture
def engine(tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints["qwen2_5_vl"],
                                  limits=Limits(max_image_pixels=200 * 200))


def _key(engine: Engine, image) -> str:
    return engine.builder.build([user(image)]).images[0].key


def test_one_pixel_changes_the_key(engine):
    img = random_image(20)
    other = img.copy()
    r, g, b = other.getpixel((5, 5))
    other.putpixel((5, 5), ((r + 128) % 256, g, b))
    assert _key(engine, img) == _key(engine, img.copy())
    assert _key(engine, img) != _key(engine, other)
    assert len(_key(engine, img)) == len("img-") + 64  # full-length digest


def test_processor_setting_changes_the_key(engine):
    img = random_image(21)
    before = _key(engine, img)
    engine.builder.image_processor = build_image_processor("qwen2_5_vl", max_pixels=512 * 28 * 28)
    engine.builder.processor_settings["size"]["longest_edge"] = 512 * 28 * 28
    assert _key(engine, img) != before


def _nothing_cached(engine: Engine) -> bool:
    return engine.store.nbytes == 0 and not list(engine.store.keys())


@pytest.mark.parametrize("bad", [
    pytest.param(b"this is not an image at all", id="text-bytes"),
    pytest.param(b"\x89PNG\r\n\x1a\n" + b"\0" * 40, id="broken-png"),
])
def test_unreadable_image_is_a_clear_error_and_caches_nothing(engine, bad):
    with pytest.raises(RequestError, match="cannot read the image"):
        engine.generate([user(random_image(22), "ok", bad)], max_tokens=2)
    assert _nothing_cached(engine)


def test_image_over_the_pixel_limit(engine):
    with pytest.raises(RequestError, match="exceeds the limit") as info:
        engine.generate([user(random_image(23, 300, 300))], max_tokens=2)
    assert info.value.status == 413
    assert _nothing_cached(engine)


def test_image_from_bytes_and_from_a_path_share_a_key(engine, tmp_path):
    img = random_image(24)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    path = tmp_path / "a.png"
    path.write_bytes(buf.getvalue())
    assert _key(engine, buf.getvalue()) == _key(engine, path) == _key(engine, img)


@pytest.mark.parametrize("messages", [[], None, [{"content": "no role"}],
                                      [{"role": "user", "content": [{"type": "audio"}]}]])
def test_malformed_messages(engine, messages):
    with pytest.raises(RequestError):
        engine.generate(messages, max_tokens=2)


def test_placeholder_text_cannot_smuggle_image_tokens(engine):
    with pytest.raises(RequestError, match="placeholder"):
        engine.generate([user("<|image_pad|>")], max_tokens=2)


def test_unsupported_architecture_directory(tiny_checkpoints, tmp_path):
    bad = tmp_path / "bert"
    shutil.copytree(tiny_checkpoints["qwen2_5_vl"], bad)
    config = json.loads((bad / "config.json").read_text())
    config["model_type"] = "bert"
    (bad / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="'bert' is not supported"):
        Engine.from_pretrained(bad)
    with pytest.raises(ModelLoadError, match="no config.json"):
        Engine.from_pretrained(tmp_path)


def test_stream_equals_generate_and_seeded_sampling_repeats(engine):
    messages = [user(random_image(25), "Say something.")]
    full = engine.generate(messages, max_tokens=10, temperature=0.9, top_p=0.9, seed=7)
    again = engine.generate(messages, max_tokens=10, temperature=0.9, top_p=0.9, seed=7)
    deltas = list(engine.stream(messages, max_tokens=10, temperature=0.9, top_p=0.9, seed=7))
    assert full.token_ids == again.token_ids
    assert "".join(d.text for d in deltas) == full.text
    assert deltas[-1].result is not None and deltas[-1].result.token_ids == full.token_ids


def test_max_tokens_and_stop_strings(engine):
    messages = [user("Count:")]
    res = engine.generate(messages, max_tokens=6)
    assert res.finish_reason == "length" and len(res.token_ids) == 6
    assert res.text, "the random model should emit visible bytes"
    stop = res.text[2:4]
    cut = engine.generate(messages, max_tokens=6, stop=[stop])
    assert cut.finish_reason == "stop" and stop not in cut.text
    assert res.text.startswith(cut.text)
    with pytest.raises(ValueError, match="max_tokens"):
        engine.generate(messages, max_tokens=0)


def test_should_stop_cancels_between_decoding_steps(engine):
    asked = []

    def stop_after_three() -> bool:
        asked.append(1)
        return len(asked) >= 3

    deltas = list(engine.stream([user("Count:")], max_tokens=50, should_stop=stop_after_three))
    result = deltas[-1].result
    assert result.finish_reason == "cancelled" and len(result.token_ids) == 3


@pytest.mark.parametrize("stop", [("",), ("", "never-said")])
def test_an_empty_stop_string_streams_every_character(engine, stop):
    messages = [user("Count:")]
    whole = engine.generate(messages, max_tokens=30, temperature=0)
    deltas = list(engine.stream(messages, max_tokens=30, temperature=0, stop=stop))
    assert "".join(d.text for d in deltas) == whole.text
    assert deltas[-1].result.text == whole.text


def test_raw_prompt_has_no_chat_template(engine):
    run = engine.prefill("Once upon a time")
    assert run.prompt.input_ids.tolist() == engine.tokenizer("Once upon a time")["input_ids"]
    assert run.prompt.segments == [] and engine.generate("Once", max_tokens=3).text is not None
    for bad in ("", "<|image_pad|>"):
        with pytest.raises(RequestError) as info:
            engine.prefill(bad)
        assert info.value.param == "prompt"


@pytest.mark.parametrize("temperature,top_p", [(1e-300, 1.0), (1.0, 1e-300), (1e-6, 0.5)])
def test_extreme_temperature_and_top_p_sample_the_top_token(temperature, top_p):
    logits = torch.tensor([0.5, 3.0, -1.0, 2.9])
    params = SamplingParams(temperature=temperature, top_p=top_p)
    assert sample(logits, params, torch.Generator().manual_seed(0)) == 1
