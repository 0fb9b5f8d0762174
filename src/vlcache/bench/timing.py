"""Interleaved timing: every round runs every case once, in a rotated order, so slow drifts of
a shared machine hit all cases alike; ratios are taken within a round, then the median."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from vlcache.bench.memory import measure


@dataclass
class Measurement:
    """One request as a case reports it; TTFT is wall-clock from request in to first token."""

    ttft_s: float
    vision_s: float | None = None  # None where the case cannot tell (transformers)
    load_s: float = 0.0
    prefill_s: float | None = None
    computed_per_layer: list[int] = field(default_factory=list)  # |C_l|
    prompt_tokens: int = 0
    image_tokens: int = 0


@dataclass
class Sample:
    case: str
    round: int
    m: Measurement
    peak_rss: int | None = None
    rss_delta: int | None = None


def round_order(names: list[str], round_index: int) -> list[str]:
    """The cases of round `round_index`: `names` rotated left by the round number."""
    k = round_index % len(names) if names else 0
    return names[k:] + names[:k]


def run_rounds(cases: dict[str, Callable[[], Measurement]], repeat: int,
               on_sample: Callable[[Sample], None] | None = None) -> list[Sample]:
    """`repeat` rounds over `cases`, interleaved; each call's peak memory is recorded too."""
    samples = []
    names = list(cases)
    for r in range(repeat):
        for name in round_order(names, r):
            m, peak = measure(cases[name])
            sample = Sample(name, r, m, peak.peak, peak.delta)
            samples.append(sample)
            if on_sample is not None:
                on_sample(sample)
    return samples


def compute_bound_limit(prompt_tokens: int, computed_per_layer: list[int]) -> float:
    """(N + T) / (sum_l |C_l| / L): the speed-up of the prefill if time were proportional to
    the token-layers computed (1.0 when every layer computes every token)."""
    if not computed_per_layer:
        return 1.0
    mean = sum(computed_per_layer) / len(computed_per_layer)
    return prompt_tokens / mean if mean else float("inf")


def per_round_ratios(samples: list[Sample], case: str, baseline: str,
                     key: Callable[[Sample], float] = lambda s: s.m.ttft_s) -> list[float]:
    """baseline / case within each round that has both (a speed-up when > 1)."""
    by_round: dict[int, dict[str, float]] = {}
    for s in samples:
        by_round.setdefault(s.round, {})[s.case] = key(s)
    return [r[baseline] / r[case] for r in by_round.values()
            if case in r and baseline in r and r[case] > 0]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None
