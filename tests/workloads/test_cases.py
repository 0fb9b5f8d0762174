"""Evaluation cases: kinds in turn, each segment cached in another context, halves by image."""

from __future__ import annotations

import pytest

from tests.conftest import random_image
from vlcache.workloads.cases import Example, build_cases, split_examples


def _examples(n: int, per_image: int = 2) -> list[Example]:
    return [Example(random_image(i // per_image), f"q{i}", "yes", f"src{i}", f"img{i // per_image}")
            for i in range(n)]


def test_cases_cycle_kinds_and_never_pair_an_image_with_itself():
    cases = build_cases(_examples(8), ("single", "reorder", "far", "before"))
    assert [c.kind for c in cases] == ["single", "reorder", "far", "before"] * 2
    for c in cases:
        assert len(c.cache_messages) == len(c.images)
        if c.kind == "reorder":
            assert c.images[0] is not c.images[1]
    with pytest.raises(ValueError, match="unknown case kind"):
        build_cases(_examples(2), ("sideways",))


def test_halves_do_not_share_images():
    first, second = split_examples(_examples(10))
    assert {e.group for e in first}.isdisjoint({e.group for e in second})
    assert len(first) == 6 and len(second) == 4
