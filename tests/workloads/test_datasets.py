"""Named data sets: image scaling, the MME reader, the synthetic set."""

from __future__ import annotations

import pytest
from PIL import Image

from tests.conftest import random_image
from vlcache.workloads.datasets import fit_image, load_examples


def test_fit_image_caps_the_token_count():
    big = Image.new("RGB", (1000, 700))
    small = fit_image(big, 64)
    assert (small.width // 28) * (small.height // 28) <= 64
    assert fit_image(small, 64) is small and fit_image(big, None) is big


def test_mme_reader(tmp_path):
    for subset in ("color", "count"):
        (tmp_path / subset).mkdir()
        for i in range(2):
            random_image(i).save(tmp_path / subset / f"{i:04d}.png")
            (tmp_path / subset / f"{i:04d}.txt").write_text(
                "Is it red? Please answer yes or no.\tYes\n"
                "Is it blue? Please answer yes or no.\tNo")
    examples = load_examples("mme", limit=6, mme=tmp_path)
    assert [e.source.split("#")[0] for e in examples[:4]] == [
        "mme/color/0000.png", "mme/color/0000.png", "mme/count/0000.png", "mme/count/0000.png"]
    assert [e.answer for e in examples[:2]] == ["Yes", "No"] and len(examples) == 6
    only = load_examples("mme:count", limit=10, mme=tmp_path)
    assert len(only) == 4 and all("count" in e.source for e in only)
    with pytest.raises(ValueError, match="no MME subset"):
        load_examples("mme:nope", mme=tmp_path)
    with pytest.raises(ValueError, match="MME data not found"):
        load_examples("mme", mme=tmp_path / "missing")
    with pytest.raises(ValueError, match="unknown data set"):
        load_examples("imagenet")


def test_synthetic_set_uses_the_seeded_generator():
    examples = load_examples("synthetic", limit=3, max_tokens=64)
    assert len(examples) == 3 and all(e.answer for e in examples)
    assert all((e.image.width // 28) * (e.image.height // 28) <= 64 for e in examples)
