"""Store faults seen from a request: the answer is the full-recompute answer, never an error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from vlcache.engine import Engine

ARCH = ARCHS[0]  # the store path is the same for every architecture


def _engine(tiny_checkpoints, store: str) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[ARCH], store=store, policy="static:0.5")


def test_corrupt_entry_is_recomputed_and_the_answer_is_the_full_one(tiny_checkpoints, tmp_path):
    engine = _engine(tiny_checkpoints, f"disk://{tmp_path}")
    img = random_image(40)
    engine.prefill([user(img, "Describe this image.")])  # a miss: computed and stored
    (path,) = Path(tmp_path).glob("img-*.vlc")
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    path.write_bytes(bytes(blob))

    messages = [user("Elsewhere:", img, "is it?")]
    run = engine.prefill(messages)
    assert run.stats.images_missed == 1 and engine.store.stats.corrupt == 1
    full = engine.prefill(messages, policy="full")
    torch.testing.assert_close(run.output.logits, full.output.logits, atol=1e-5, rtol=1e-5)
    assert engine.prefill(messages).stats.images_hit == 1  # the recomputed entry was stored


def test_redis_gone_requests_still_succeed(tiny_checkpoints, spawn_redis):
    pytest.importorskip("redis")
    server = spawn_redis()
    engine = _engine(tiny_checkpoints, f"memory://+{server.url}?retry=30&timeout=0.5")
    redis_tier = engine.store.back
    seen, new = random_image(41), random_image(42)
    engine.prefill([user(seen, "Describe this image.")])
    server.stop()
    assert engine.prefill([user("Again:", seen, "?")]).stats.images_hit == 1  # from memory
    run = engine.prefill([user(new, "And this one?")])  # computed in full, cached in memory
    assert run.stats.images_missed == 1 and not redis_tier.available
    assert redis_tier.stats.errors + redis_tier.stats.unavailable >= 1
    assert engine.prefill([user("Again:", new, "?")]).stats.images_hit == 1
