"""Stores stacked fastest first: read-through with promotion, write-through."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from vlcache.entry import ImageEntry
from vlcache.stores.base import Store, StoreStats, StoreUsage


class TieredStore(Store):
    """`tiers[0]` is asked first (e.g. memory), then each slower tier (disk, Redis).

    A hit in a slower tier is copied into every faster one; a put goes to every tier. Each tier
    fails on its own terms (a Redis outage is a miss there and a skipped put), so the faster
    tiers keep serving. Every tier must store KV in the same dtype, since the engine names its
    image keys after it.
    """

    def __init__(self, tiers: Sequence[Store]) -> None:
        super().__init__()
        if len(tiers) < 2:
            raise ValueError("a tiered store needs at least two tiers")
        dtypes = {t.kv_dtype for t in tiers}
        if len(dtypes) > 1:
            raise ValueError(
                "every tier must store KV in the same dtype: set the same kv_dtype=... on each "
                f"tier of {'+'.join(t.address for t in tiers)!r}"
            )
        self.tiers = list(tiers)
        self.kv_dtype = self.tiers[0].kv_dtype
        self.address = "+".join(t.address for t in self.tiers)

    @property
    def stats(self) -> StoreStats:
        """Whole lookups (hits, misses, puts); faults, evictions and bytes summed over the tiers,
        so that one exporter reading `store.stats` also sees e.g. a Redis tier's errors."""
        merged = StoreStats(hits=self._own.hits, misses=self._own.misses, puts=self._own.puts)
        for tier in self.tiers:
            for name in ("corrupt", "errors", "unavailable", "evictions", "bytes_read",
                         "bytes_written"):
                setattr(merged, name, getattr(merged, name) + getattr(tier.stats, name))
        return merged

    @stats.setter
    def stats(self, value: StoreStats) -> None:
        self._own = value

    @property
    def front(self) -> Store:
        return self.tiers[0]

    @property
    def back(self) -> Store:
        return self.tiers[-1]

    def get(self, key: str) -> ImageEntry | None:
        for i, tier in enumerate(self.tiers):
            entry = tier.get(key)
            if entry is not None:
                for faster in self.tiers[:i]:
                    faster.put(key, entry)
                self._own.hits += 1
                return entry
        self._own.misses += 1
        return None

    def put(self, key: str, entry: ImageEntry) -> None:
        for tier in self.tiers:
            tier.put(key, entry)
        self._own.puts += 1

    def contains(self, key: str) -> bool:
        return any(tier.contains(key) for tier in self.tiers)

    def delete(self, key: str) -> bool:
        return any([tier.delete(key) for tier in self.tiers])  # a list: delete from every tier

    def keys(self) -> Iterable[str]:
        return list(dict.fromkeys(k for tier in self.tiers for k in tier.keys()))

    @property
    def nbytes(self) -> int:
        return sum(tier.nbytes for tier in self.tiers)

    @property
    def usage(self) -> StoreUsage:
        """Summed over the tiers (an entry in two tiers counts twice: it is held twice)."""
        return sum((tier.usage for tier in self.tiers), StoreUsage())

    def recount(self) -> StoreUsage:
        return sum((tier.recount() for tier in self.tiers), StoreUsage())

    def clear(self) -> None:
        for tier in self.tiers:
            tier.clear()

    def close(self) -> None:
        for tier in self.tiers:
            tier.close()
