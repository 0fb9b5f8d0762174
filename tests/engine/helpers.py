"""Reference computations with plain transformers, to compare the engine against."""

from __future__ import annotations

import torch

from vlcache.engine import Engine
from vlcache.engine.request import Prompt


def hf_inputs(engine: Engine, prompt: Prompt) -> dict:
    ids = prompt.input_ids[None]
    if engine.adapter.image_token_id is None:  # a text-only model
        return {"input_ids": ids}
    inputs = {"input_ids": ids,
              "mm_token_type_ids": (ids == engine.adapter.image_token_id).int()}
    if prompt.images:
        inputs["pixel_values"] = torch.cat([im.pixel_values for im in prompt.images])
        inputs["image_grid_thw"] = prompt.grid_thw
    return inputs


def hf_logits(engine: Engine, prompt: Prompt) -> torch.Tensor:  # [S, V]
    model = engine.adapter.model
    if hasattr(model.model, "rope_deltas"):
        model.model.rope_deltas = None
    with torch.no_grad():
        return model(**hf_inputs(engine, prompt)).logits[0].float()


def hf_greedy(engine: Engine, prompt: Prompt, max_new_tokens: int) -> list[int]:
    model = engine.adapter.model
    model.model.rope_deltas = None
    inputs = hf_inputs(engine, prompt)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
    return out[0, inputs["input_ids"].shape[1]:].tolist()
