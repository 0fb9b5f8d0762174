"""The user's alternative: plain `transformers` generate (one new token) on the full prompt."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from vlcache.bench.timing import Measurement
from vlcache.engine import Engine


class _Stopwatch:
    """Sums the wall time spent inside a module (the vision tower) through forward hooks."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.total = 0.0
        self._start = 0.0
        module.register_forward_pre_hook(self._enter)
        module.register_forward_hook(self._leave)

    def _enter(self, *_: Any) -> None:
        self._start = time.perf_counter()

    def _leave(self, *_: Any) -> None:
        self.total += time.perf_counter() - self._start


def transformers_case(engine: Engine, messages: list[dict]) -> Callable[[], Measurement]:
    """Time `model.generate(..., max_new_tokens=1)` including the same preprocessing as the
    engine (chat template, image processor; the engine's key hashing too, a few ms)."""
    model = engine.model
    watch = _Stopwatch(model.model.visual)

    def run() -> Measurement:
        start = time.perf_counter()
        watch.total = 0.0
        prompt = engine.prepare(messages)
        ids = prompt.input_ids[None]  # [1, S]
        inputs = {"input_ids": ids,
                  "mm_token_type_ids": (ids == engine.image_token_id).int()}
        if prompt.images:
            inputs["pixel_values"] = torch.cat([im.pixel_values for im in prompt.images])
            inputs["image_grid_thw"] = prompt.grid_thw
        inputs = {k: v.to(model.device) for k, v in inputs.items()}
        model.model.rope_deltas = None  # transformers keeps it between calls
        with torch.inference_mode():
            model.generate(**inputs, max_new_tokens=1, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
        return Measurement(ttft_s=time.perf_counter() - start, vision_s=watch.total,
                           prompt_tokens=int(ids.shape[1]),
                           image_tokens=sum(im.num_tokens for im in prompt.images))

    return run
