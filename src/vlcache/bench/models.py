"""The model under test: a random-weight model of a real size (optionally fewer layers), or a
checkpoint directory. Timing does not depend on weight values (design §5)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from vlcache.engine import Engine
from vlcache.keys import ModelFingerprint
from vlcache.models.adapter import QwenVLAdapter
from vlcache.models.synthetic import SIZES, SyntheticSpec, build_model

# The fixture's language model (Qwen2.5-0.5B: 24 x 896, 14 heads, 2 KV heads, MLP 4864) and its
# small trained vision tower (fixture/README.md); the random model has a byte-level vocabulary,
# which only changes the embedding lookup and the one-token head.
FIXTURE_SPEC = SyntheticSpec("qwen2_5_vl", 896, 24, 14, 2, 4864, 256, 6, 4, 1024)
BENCH_SIZES: dict[str, SyntheticSpec] = {**SIZES, "fixture-qwen2_5_vl-0.5b": FIXTURE_SPEC}

# Qwen2.5-VL vision towers attend over the whole image in every k-th block and within windows
# elsewhere (published: blocks 7, 15, 23, 31 of 32; the fixture: 2 and 5 of 6).
FULL_ATTENTION_EVERY = {"qwen2_5_vl-3b": 8, "qwen2_5_vl-7b": 8, "fixture-qwen2_5_vl-0.5b": 3}


@dataclass(frozen=True)
class ModelInfo:
    """What the report says about the model: its name, source and the depths actually run."""

    name: str
    source: str  # "random weights, seed S" or the checkpoint path
    arch: str
    layers: int
    published_layers: int
    vision_depth: int
    published_vision_depth: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str

    @property
    def reduced(self) -> bool:
        return self.layers != self.published_layers

    def describe(self) -> str:
        depth = f"{self.layers} layers"
        if self.reduced:
            depth = (f"{self.layers} of {self.published_layers} layers and {self.vision_depth} of "
                     f"{self.published_vision_depth} vision blocks")
        return (f"{self.name} ({self.source}; {depth}, hidden {self.hidden}, {self.heads} heads, "
                f"{self.kv_heads} KV heads, {self.dtype})")


def reduced_spec(spec: SyntheticSpec, layers: int | None) -> SyntheticSpec:
    """`spec` with `layers` decoder layers and the vision depth scaled by the same factor, so the
    vision tower's share of the time stays what it is at full depth."""
    if layers is None or layers == spec.layers:
        return spec
    if not 1 <= layers <= spec.layers:
        raise ValueError(f"--layers must be in [1, {spec.layers}], got {layers}")
    depth = max(1, round(spec.vision_depth * layers / spec.layers))
    return dataclasses.replace(spec, layers=layers, vision_depth=depth)


def _set_full_attention(model: torch.nn.Module, every: int, depth: int) -> None:
    blocks = [i for i in range(depth) if (i + 1) % every == 0] or [depth - 1]
    model.model.visual.fullatt_block_indexes = blocks
    model.config.vision_config.fullatt_block_indexes = blocks


def random_engine(name: str, layers: int | None = None, seed: int = 0,
                  dtype: torch.dtype = torch.float32, store: str = "memory://",
                  device: str = "cpu", packing: str = "auto") -> tuple[Engine, ModelInfo]:
    """An engine over a random-weight model of the size `name` (see BENCH_SIZES)."""
    if name not in BENCH_SIZES:
        raise ValueError(f"unknown size {name!r}; known: {', '.join(sorted(BENCH_SIZES))}")
    published = BENCH_SIZES[name]
    spec = reduced_spec(published, layers)
    model, tokenizer, processor = build_model(spec, seed=seed, dtype=dtype, device=device)
    if name in FULL_ATTENTION_EVERY:
        _set_full_attention(model, FULL_ATTENTION_EVERY[name], spec.vision_depth)
    adapter = QwenVLAdapter(model, ModelFingerprint(spec.arch, f"random-{name}-{seed}"))
    info = ModelInfo(name, f"random weights, seed {seed}", spec.arch, spec.layers,
                     published.layers, spec.vision_depth, published.vision_depth, spec.hidden,
                     spec.heads, spec.kv_heads, adapter.head_dim, str(dtype).split(".")[-1])
    return Engine(adapter, tokenizer, processor, store=store, packing=packing), info


def checkpoint_engine(path: str | Path, dtype: torch.dtype = torch.float32,
                      store: str = "memory://", device: str = "cpu", packing: str = "auto"
                      ) -> tuple[Engine, ModelInfo]:
    """An engine over a local checkpoint directory."""
    engine = Engine.from_pretrained(path, store=store, dtype=dtype, device=device,
                                    packing=packing)
    a = engine.shape
    vision = engine.model.config.vision_config
    depth = int(getattr(vision, "depth", 0))
    info = ModelInfo(Path(path).name, str(path), a.architecture, a.layers, a.layers,
                     depth, depth, a.hidden, a.heads, a.kv_heads, a.head_dim,
                     str(dtype).split(".")[-1])
    return engine, info
