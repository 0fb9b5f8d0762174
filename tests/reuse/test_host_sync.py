"""The per-layer loop of a hit reads no tensor value on the host (a GPU would stall on each).

Checked on the CPU: every torch call inside `selective_prefill` goes through a function mode
that records the calls which copy a value to the host (`item`, `bool(t)`, `int(t)`, `tolist`,
`nonzero`, indexing with a boolean mask).
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tests.conftest import ARCHS, random_image, user
from vlcache.engine import Engine
from vlcache.reuse import prefill as prefill_module

SYNCING = {"item", "tolist", "nonzero", "__bool__", "__int__", "__float__", "__index__",
           "argwhere", "masked_select", "unique", "allclose", "equal"}


class HostSyncs(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if name in SYNCING or (name in {"__getitem__", "__setitem__"} and _bool_index(args)):
            self.calls.append(name)
        return func(*args, **(kwargs or {}))


def _bool_index(args) -> bool:
    index = args[1] if len(args) > 1 else None
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


@pytest.fixture(scope="module", params=ARCHS)
def engine(request, tiny_checkpoints) -> Engine:
    return Engine.from_pretrained(tiny_checkpoints[request.param], policy="naive")


@pytest.mark.parametrize("policy", ["static:0.25", "epic:3", "query:0.25", "cacheblend:0.3:1",
                                    "naive"])
def test_a_hit_prefills_without_reading_tensor_values(engine, policy, monkeypatch):
    images = [random_image(s) for s in (90, 91)]
    for img in images:
        engine.prefill([user(img, "Describe this image.")])
    seen: list[HostSyncs] = []
    real = prefill_module.selective_prefill

    def watched(*args, **kwargs):
        with HostSyncs() as mode:
            out = real(*args, **kwargs)
        seen.append(mode)
        return out

    monkeypatch.setattr("vlcache.engine.engine.selective_prefill", watched)
    run = engine.prefill([{"role": "system", "content": "Be brief."},
                          user("Compare", images[1], "with", images[0])], policy=policy,
                         store_entries=False)
    assert run.stats.images_kv_reused == 2 and len(seen) == 1
    assert seen[0].calls == []


def test_the_watch_sees_a_host_read():
    with HostSyncs() as mode:
        t = torch.arange(4)
        if t[0] == 0:
            t[t > 1] = 0
    assert mode.calls == ["__bool__", "__setitem__"]
