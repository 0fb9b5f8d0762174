"""Counters one encoder cache keeps (one per process and role: vLLM's scheduler and worker
each hold their own)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields


@dataclass
class CacheMetrics:
    """Monotonic counters. `damaged` entries are misses too (they are counted in both);
    `rejected` entries were intact but do not fit the model (dtype, width), also misses."""

    hits: int = 0
    misses: int = 0
    damaged: int = 0  # truncated, bit-flipped or written for another key/model: removed
    rejected: int = 0  # intact, but another dtype or width than the model's encoder gives
    errors: int = 0  # an exception inside the cache, answered as a miss or a skipped save
    saves: int = 0
    bytes_loaded: int = 0  # tensor bytes of hits
    bytes_saved: int = 0  # tensor bytes of saves
    load_seconds: float = 0.0  # reading and checking entries, hits and misses alike
    save_seconds: float = 0.0

    def as_dict(self) -> dict[str, int | float]:
        return asdict(self)

    def minus(self, earlier: CacheMetrics) -> CacheMetrics:
        """What happened since `earlier` (a copy taken with `snapshot`)."""
        return CacheMetrics(**{f.name: getattr(self, f.name) - getattr(earlier, f.name)
                               for f in fields(self)})

    def snapshot(self) -> CacheMetrics:
        return CacheMetrics(**asdict(self))
