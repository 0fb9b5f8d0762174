"""Per-round ratios peer / vlcache (> 1: vlcache faster), then median and min-max per case and
size. A ratio is taken only within a round where both engines answered."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from peer.cases import CASES
from peer.samples import Sample

BASE, PEER = "vlcache", "vLLM"


@dataclass
class Summary:
    size: int
    case: str
    ratios: list[float]  # one per round with both engines' times, in round order
    seconds: dict[str, float | None]  # median TTFT per engine
    prompt_tokens: dict[str, int | None]
    cached_tokens: dict[str, float | None]  # median per engine
    computed_tokens: dict[str, float | None]
    errors: list[Sample] = field(default_factory=list)

    @property
    def median(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None

    @property
    def span(self) -> tuple[float, float] | None:
        return (min(self.ratios), max(self.ratios)) if self.ratios else None


def round_ratios(samples: list[Sample], size: int, case: str, base: str = BASE,
                 peer: str = PEER) -> list[float]:
    """peer / base TTFT in each round where both succeeded, rounds in order."""
    by_round: dict[int, dict[str, float]] = {}
    for s in samples:
        if s.size == size and s.case == case and s.ok:
            by_round.setdefault(s.round, {})[s.engine] = s.ttft_s
    return [t[peer] / t[base] for _, t in sorted(by_round.items())
            if base in t and peer in t and t[base] > 0]


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(samples: list[Sample], engines: tuple[str, str] = (BASE, PEER)
              ) -> list[Summary]:
    """One summary per (size, case) present, sizes ascending, cases in CASES order."""
    cases = sorted({s.case for s in samples},
                   key=lambda c: (CASES.index(c) if c in CASES else len(CASES), c))
    out = []
    for size in sorted({s.size for s in samples}):
        for case in cases:
            mine = [s for s in samples if s.size == size and s.case == case]
            if not mine:
                continue

            def per_engine(attr: str, mine=mine) -> dict:
                return {e: _median([getattr(s, attr) for s in mine if s.engine == e and s.ok])
                        for e in engines}

            out.append(Summary(size, case, round_ratios(samples, size, case, *engines),
                               per_engine("ttft_s"), per_engine("prompt_tokens"),
                               per_engine("cached_tokens"), per_engine("computed_tokens"),
                               [s for s in mine if not s.ok]))
    return out


def core_share(samples: list[Sample], engine: str) -> dict[str, float | None]:
    """Median over an engine's requests of CPU seconds per wall second: its busiest thread
    (how much of a core the compute got) and all its threads (helpers included)."""
    mine = [s for s in samples if s.engine == engine and s.ok and s.ttft_s]
    return {"top": _median([s.cpu_top_s / s.ttft_s for s in mine if s.cpu_top_s is not None]),
            "all": _median([s.cpu_s / s.ttft_s for s in mine if s.cpu_s is not None])}
