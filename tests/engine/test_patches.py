"""A hit is keyed and placed without preprocessing its image; a miss preprocesses it once."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ARCHS, random_image, user
from vlcache.engine import Engine
from vlcache.engine.patches import GridMismatchError, Patcher
from vlcache.models.synthetic import build_image_processor

SIZES = [(1, 2), (2, 2), (30, 20), (56, 56), (84, 112), (113, 57), (500, 7), (7, 500),
         (640, 480), (1000, 1000), (1920, 1080), (3000, 17), (4000, 3000)]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen3_vl"])  # patch 14 and patch 16
@pytest.mark.parametrize("max_pixels", [64 * 28 * 28, 1280 * 28 * 28])
def test_predicted_grid_is_the_processors(arch, max_pixels):
    patcher = Patcher(build_image_processor(arch, max_pixels=max_pixels))
    assert patcher.predicts
    for w, h in SIZES:
        _, grid = patcher.patches(random_image(w * 7 + h, w, h))
        assert torch.equal(patcher.grid(w, h), grid), (w, h)


def test_a_processor_that_does_not_resize_is_run_eagerly():
    processor = build_image_processor("qwen2_vl")
    processor.do_resize = False
    patcher = Patcher(processor)
    assert not patcher.predicts and patcher.grid(56, 56) is None


@pytest.fixture(params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="naive")


def _count_preprocessing(engine: Engine) -> list[int]:
    calls = [0]
    patches = engine.builder.patcher.patches

    def counted(image):
        calls[0] += 1
        return patches(image)

    engine.builder.patcher.patches = counted
    return calls


def test_a_hit_never_preprocesses_its_image(engine):
    calls = _count_preprocessing(engine)
    img, other = random_image(40), random_image(41, 84, 112)
    first = engine.prefill([user(img, "Describe this image.")])
    assert calls[0] == 1 and first.stats.images_missed == 1
    run = engine.prefill([user("Now:", img, other, "Compare.")])
    assert run.stats.images_hit == 1 and run.stats.images_missed == 1
    assert calls[0] == 2  # only the new image
    assert run.stats.prepare_s > 0
    engine.prefill([user("Again:", other, img, "?")], policy="static:0.5")
    assert calls[0] == 2


def test_a_wrong_grid_prediction_fails_loudly(engine, monkeypatch):
    patcher = engine.builder.patcher
    monkeypatch.setattr(patcher, "grid", lambda w, h: torch.tensor([1, 2, 2]))
    with pytest.raises(GridMismatchError):
        engine.prefill([user(random_image(42), "?")])


def test_another_preprocessing_library_version_gives_another_key(engine, monkeypatch):
    import vlcache.keys

    img = random_image(43)
    before = engine.builder.build([user(img)]).images[0].key
    monkeypatch.setattr(vlcache.keys, "_PREPROCESSING_CODE", "transformers 99.0, pillow 1.0")
    assert engine.builder.build([user(img)]).images[0].key != before
