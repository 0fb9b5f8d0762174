"""The batched profiler equals the engine's naive prefill over a patched cache entry."""

from __future__ import annotations

import math

import pytest
import torch

from tests.conftest import ARCHS, random_image
from vlcache.engine import Engine
from vlcache.entry import ImageEntry
from vlcache.planner.profile import probe_inputs
from vlcache.reuse.sensitivity import sensitivity
from vlcache.workloads.cases import Example, make_case

RATIOS = [0.0, 0.25, 0.5, 1.0]


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param])


def _patched(entry: ImageEntry, exact: tuple[torch.Tensor, torch.Tensor], layer: int,
             ratio: float, order: torch.Tensor | None = None) -> ImageEntry:
    keys, values = entry.keys.clone(), entry.values.clone()
    m = math.ceil(ratio * entry.num_tokens - 1e-9)
    top = (order if order is not None else torch.arange(entry.num_tokens))[:m]
    keys[layer, top], values[layer, top] = exact[0][layer, top], exact[1][layer, top]
    return ImageEntry(entry.embeds, entry.deepstack, keys, values, entry.positions, entry.context)


def _reference(engine: Engine, case, probe, layer: int, ratio: float) -> float:
    keys = [im.key for im in engine.builder.build(case.messages).images]
    saved = [engine.store.get(k) for k in keys]
    try:
        orders = probe.orders or [None] * len(keys)
        for key, entry, exact, order in zip(keys, saved, probe.exact, orders, strict=True):
            engine.store.put(key, _patched(entry, exact, layer, ratio, order))
        run = engine.prefill(case.messages, policy="naive", store_entries=False)
    finally:
        for key, entry in zip(keys, saved, strict=True):
            engine.store.put(key, entry)
    return float((run.output.logits - probe.target).pow(2).sum())


@pytest.mark.parametrize(("kind", "rule"), [("single", "first"), ("reorder", "first"),
                                            ("reorder", "query")])
def test_sensitivity_equals_naive_prefill_with_patched_kv(engine, kind, rule):
    first = Example(random_image(31), "What is it?", None, "a", "a")
    second = Example(random_image(32, 140, 112), "And this?", None, "b", "b")
    case = make_case(kind, first, second if kind == "reorder" else None)
    probe = probe_inputs(engine, case, rule)
    if rule == "query":  # the question's order is not position order
        assert probe.orders is not None
        assert any(not torch.equal(o, torch.arange(o.numel())) for o in probe.orders)
    table = sensitivity(engine.adapter, probe, RATIOS)
    assert table.shape == (engine.adapter.num_layers, len(RATIOS))
    assert table[:, 0].min() == table[:, 0].max() > 0  # r = 0 is naive at every layer
    for layer in range(engine.adapter.num_layers):
        for j, ratio in enumerate(RATIOS[1:], start=1):
            want = _reference(engine, case, probe, layer, ratio)
            assert float(table[layer, j]) == pytest.approx(want, rel=1e-4, abs=1e-7)
