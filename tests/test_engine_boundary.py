"""The engine is the only way into the layer loop: no module outside engine/ reads its parts."""

from __future__ import annotations

import re
from pathlib import Path

import vlcache

ROOT = Path(vlcache.__file__).parent
# An engine's parts (the adapter with the layer loop, the prompt builder, the segment cache,
# its token sets) and private names; reading the store's usage and counters is public.
PRIVATE = re.compile(r"\bengine\.(adapter|builder|cache|stop_ids|turn_ids|_\w+)\b"
                     r"|\bengine\.store\.(get|put|delete|contains)\w*")


def reaches(text: str) -> list[str]:
    return [m.group(0) for m in PRIVATE.finditer(text)]


def test_nothing_outside_the_engine_reads_its_parts():
    found = {str(p.relative_to(ROOT)): hits for p in ROOT.rglob("*.py")
             if p.parent.name != "engine" and (hits := reaches(p.read_text()))}
    assert found == {}


def test_the_check_sees_each_kind_of_reach():
    text = ("engine.adapter.num_layers; self.engine.builder.build(m); engine.cache.get(k); "
            "engine._policy(p); engine.store.delete(k); engine.store.usage; "
            "engine.cached_entry(k); engine.num_layers")
    assert reaches(text) == ["engine.adapter", "engine.builder", "engine.cache",
                             "engine._policy", "engine.store.delete"]
