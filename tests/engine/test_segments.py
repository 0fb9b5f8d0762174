"""Reusable text segments (documents) go through the same entries, plans and prefill as images."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import TEXT_ARCHS, document, random_image, user
from tests.engine.helpers import hf_logits
from vlcache.engine import Engine, RequestError
from vlcache.reuse.rope import apply_rope

DOC_A = "The river Omblen flows through Tarsk and ends in the Lake of Vire."
DOC_B = "Mount Kesh is the highest peak of Ordovia; its first climber was Ilse Marr."


@pytest.fixture(params=TEXT_ARCHS)
def text_engine(request, tiny_text_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_text_checkpoints[request.param], policy="static:1.0")


def _all_logits(engine: Engine, messages: list[dict]):
    run = engine.prefill(messages, keep_hidden=True)
    assert run.stats.computed_per_layer == [run.stats.prompt_tokens] * engine.adapter.num_layers
    return engine.adapter.logits(run.output.final_hidden), run


def test_text_model_documents_reused_in_new_order_equal_full_forward(text_engine):
    text_engine.prefill([user(document(DOC_A), "Summarize this document:")])
    text_engine.prefill([{"role": "system", "content": "Other system."},
                         user(document(DOC_B), "Summarize this document:")])
    messages = [{"role": "system", "content": "Answer from the documents."},
                user(document(DOC_B), "\n", document(DOC_A), "Where does the Omblen end?")]
    logits, run = _all_logits(text_engine, messages)
    assert run.stats.documents == 2 and run.stats.documents_reused == 2
    torch.testing.assert_close(logits, hf_logits(text_engine, run.prompt), atol=1e-4, rtol=0)


def test_text_model_naive_reuse_rotates_cached_keys(text_engine):
    text_engine.prefill([user(document(DOC_A), "Summarize this document:")])
    messages = [user("Question first, then the text:", document(DOC_A))]
    run = text_engine.prefill(messages, policy="naive")
    seg = run.prompt.segments[0]
    rows = slice(seg.start, seg.start + seg.num_tokens)
    entry = text_engine.store.get(seg.key)
    assert run.stats.text_tokens_reused == seg.num_tokens == run.stats.cached_tokens
    want = [run.stats.prompt_tokens - seg.num_tokens] * text_engine.adapter.num_layers
    assert run.stats.computed_per_layer == want
    cos, sin = text_engine.adapter.rope_tables(run.positions[:, rows])
    for layer in range(text_engine.adapter.num_layers):
        got = run.output.cache.keys[layer][:, rows].transpose(0, 1)
        torch.testing.assert_close(got, apply_rope(entry.keys[layer], cos, sin))
    direct = text_engine.prefill(messages, policy="full").output.cache.keys[0][:, rows]
    torch.testing.assert_close(direct.transpose(0, 1), apply_rope(entry.keys[0], cos, sin),
                               atol=1e-5, rtol=1e-5)


def test_document_key_depends_on_its_tokens_only(text_engine):
    key = text_engine.builder.build([user(document(DOC_A))]).segments[0].key
    elsewhere = text_engine.builder.build([{"role": "system", "content": "x"},
                                           user("before", document(DOC_A), "after")])
    assert elsewhere.segments[0].key == key and key.startswith("txt-")
    cached_text = {"type": "text", "text": DOC_A, "cache": True}
    assert text_engine.builder.build([user(cached_text)]).segments[0].key == key
    assert text_engine.builder.build([user(document(DOC_B))]).segments[0].key != key


def test_text_model_refuses_images_and_reserved_text(text_engine):
    with pytest.raises(RequestError, match="takes no images"):
        text_engine.generate([user(random_image(1), "?")], max_tokens=2)
    with pytest.raises(RequestError, match="reserved"):
        text_engine.generate([user("a\x00vlcache-segment\x00b", document(DOC_A))], max_tokens=2)
    assert text_engine.store.nbytes == 0


def test_vl_model_mixes_an_image_and_a_document(tiny_checkpoints):
    # exact_hits=False: no block prefix cache, so the second run's counts are the policy's
    engine = Engine.from_pretrained(tiny_checkpoints["qwen2_5_vl"], policy="static:1.0",
                                    exact_hits=False)
    img = random_image(30)
    engine.prefill([user(img, "Describe this image.")])
    engine.prefill([user(document(DOC_A), "Summarize this document:")])
    messages = [{"role": "system", "content": "Compare."},  # not the prefix DOC_A was cached in
                user(document(DOC_A), "and the picture", img, "Which fits better?")]
    logits, run = _all_logits(engine, messages)
    assert run.stats.images_kv_reused == 1 and run.stats.documents_reused == 1
    torch.testing.assert_close(logits, hf_logits(engine, run.prompt), atol=1e-4, rtol=0)
    partial = engine.prefill(messages, policy="static:0.25")
    n = [s.num_tokens for s in partial.prompt.segments]
    text = partial.stats.prompt_tokens - sum(n)
    want = text + sum(-(-x // 4) for x in n)
    assert partial.stats.computed_per_layer == [want] * engine.adapter.num_layers
