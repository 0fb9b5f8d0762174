"""A recompute plan: per-layer ratios of a reused segment's tokens to compute (design §1, §3)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PLAN_FORMAT = 2  # 2 added `rule`; format-1 files load with rule "first"
FORMATS = (1, 2)
# How a layer's count of tokens is filled (reuse/ranking.py): the first tokens in position
# order, the tokens the question attends to most, or (analysis only) those farthest from a full
# run.
RULES = ("first", "query", "oracle")


def tokens_for(ratio: float, num_tokens: int) -> int:
    """How many of a segment's N tokens a ratio r computes: ceil(r·N), r·N's float noise aside."""
    return min(num_tokens, math.ceil(ratio * num_tokens - 1e-9))


@dataclass(frozen=True)
class Plan:
    """Per-layer recompute ratios r_1 >= r_2 >= ... >= r_L, each in [0, 1], and the ranking
    rule that picks which tokens fill each layer's count (`first` unless the plan says).

    The monotone order is what makes selective prefill well defined: a token computed at layer
    l+1 was computed at layer l, so its layer-l output exists. A plan with `start_layer` R > 0
    computes nothing below R and is monotone from R on: its layer-R tokens resume from the
    hidden state the cache entry holds for layer R's input (an engine captures it with
    `capture_hidden_at=R`; entries without it fall back to computing layer R's tokens from
    layer 0). `meta` carries provenance (model fingerprint, budget, grid, the sensitivity
    table, the dataset) and is kept verbatim.
    """

    ratios: tuple[float, ...]
    name: str = "plan"
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    start_layer: int = 0
    rule: str = "first"

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown ranking rule {self.rule!r}: expected one of "
                             f"{', '.join(RULES)}")
        if not self.ratios:
            raise ValueError("a plan needs at least one layer")
        for i, r in enumerate(self.ratios):
            if not (0.0 <= r <= 1.0) or math.isnan(r):
                raise ValueError(f"plan ratio at layer {i} is {r}, outside [0, 1]")
        if not 0 <= self.start_layer < len(self.ratios):
            raise ValueError(f"start layer {self.start_layer} is not a layer of this "
                             f"{len(self.ratios)}-layer plan")
        if any(self.ratios[: self.start_layer]):
            raise ValueError(f"a plan starting at layer {self.start_layer} computes nothing "
                             "below it (its ratios there must be 0)")
        for i in range(self.start_layer + 1, len(self.ratios)):
            if self.ratios[i] > self.ratios[i - 1] + 1e-12:
                raise ValueError(
                    f"plan ratios must not increase with depth: layer {i} has {self.ratios[i]} > "
                    f"layer {i - 1}'s {self.ratios[i - 1]}"
                )

    @classmethod
    def uniform(cls, ratio: float, num_layers: int, name: str | None = None) -> Plan:
        return cls(tuple([float(ratio)] * num_layers), name=name or f"static:{ratio:g}")

    @property
    def num_layers(self) -> int:
        return len(self.ratios)

    @property
    def budget(self) -> float:
        """Mean ratio over layers: the share of a reused image's token-layers that is computed."""
        return sum(self.ratios) / len(self.ratios)

    def tokens_at(self, layer: int, num_tokens: int) -> int:
        """How many of an image's N tokens (in position order) layer `layer` computes."""
        return tokens_for(self.ratios[layer], num_tokens)

    def to_json(self) -> str:
        start = {"start_layer": self.start_layer} if self.start_layer else {}
        body = {"format": PLAN_FORMAT, "name": self.name, "rule": self.rule,
                "ratios": list(self.ratios), "budget": self.budget, **start, **self.meta}
        return json.dumps(body, indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        body = json.loads(text)
        if not isinstance(body, dict) or "ratios" not in body:
            raise ValueError("not a vlcache plan: no 'ratios'")
        if body.get("format", PLAN_FORMAT) not in FORMATS:
            raise ValueError(f"plan format {body.get('format')} is not supported")
        fields = {"format", "name", "ratios", "budget", "start_layer", "rule"}
        meta = {k: v for k, v in body.items() if k not in fields}
        start = body.get("start_layer", 0)
        if not isinstance(start, int) or isinstance(start, bool):
            raise ValueError(f"plan start_layer must be an integer, got {start!r}")
        return cls(tuple(float(r) for r in body["ratios"]), name=body.get("name", "plan"),
                   meta=meta, start_layer=start, rule=body.get("rule", "first"))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ValueError(f"cannot read plan file {path}: {e.strerror}") from e
        return cls.from_json(text)
