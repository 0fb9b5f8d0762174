"""What the worker hands the model for one step: the step's reused and saved images."""

from __future__ import annotations

from dataclasses import dataclass, field

from vlcache_vllm.reuse.rows import StepImage, Window


@dataclass
class Step:
    """Images of the step's requests that reuse an entry (hits) or save one (misses), in the
    batch's request order. The model fills `windows` (each request's scheduled rows)."""

    images: list[StepImage]
    windows: list[Window] = field(default_factory=list)
    reused_rows: int = 0  # image rows x layers taken from entries in this step
