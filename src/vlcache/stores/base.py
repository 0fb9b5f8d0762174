"""The store interface every cache backend implements, and the address-string factory."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from vlcache.entry import ImageEntry

if TYPE_CHECKING:
    import torch


log = logging.getLogger("vlcache.stores")


@dataclass
class StoreStats:
    """Monotonic counters one store keeps (read by the metrics exporter)."""

    hits: int = 0
    misses: int = 0
    puts: int = 0
    corrupt: int = 0  # entries rejected by the checksum or header check (and removed)
    errors: int = 0  # I/O or connection failures: the get missed or the put was skipped
    unavailable: int = 0  # calls answered without trying, while a backend is known to be down
    evictions: int = 0
    bytes_read: int = 0  # serialised bytes of hits
    bytes_written: int = 0  # serialised bytes of successful puts

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class StoreUsage:
    """What a store holds, as last counted (see `Store.usage`)."""

    bytes: int = 0
    entries: int = 0

    def __add__(self, other: StoreUsage) -> StoreUsage:
        return StoreUsage(self.bytes + other.bytes, self.entries + other.entries)


class Store(ABC):
    """A key -> ImageEntry map with a size budget.

    Contract: `get` returns an entry equal to what was `put` (KV possibly in the store's
    `kv_dtype`), or None. A corrupt, truncated or mismatched entry is a miss (never an exception,
    never a wrong entry) and is removed. A backend that fails (disk full, Redis down) turns `get`
    into a miss and `put` into a logged no-op. Batched calls default to loops; backends override
    them when they can do better. Counters live in `stats`; bytes and entries held in `usage`.
    """

    address: str
    kv_dtype: torch.dtype | None = None  # KV is stored in this dtype (None: as given)

    def __init__(self) -> None:
        self.stats = StoreStats()
        self._usage = StoreUsage()

    @abstractmethod
    def get(self, key: str) -> ImageEntry | None: ...

    @abstractmethod
    def put(self, key: str, entry: ImageEntry) -> None: ...

    @abstractmethod
    def contains(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> bool: ...

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes currently held, counted now (may scan the backend; `usage` never does)."""

    def __len__(self) -> int:
        return sum(1 for _ in self.keys())

    @property
    def usage(self) -> StoreUsage:
        """Bytes and entries held, as last counted: O(1), never waits on the backend, so it is
        safe on an event loop. Backends update it on their own puts and deletes; `recount`
        brings in what other processes, expiry and eviction did."""
        return self._usage

    def recount(self) -> StoreUsage:
        """Count bytes and entries in the backend itself (slow: a directory listing, a Redis
        scan), remember them as `usage`, and return them. Call it off the request path."""
        self._usage = StoreUsage(self.nbytes, len(self))
        return self._usage

    @abstractmethod
    def keys(self) -> Iterable[str]: ...

    def get_many(self, keys: Sequence[str]) -> list[ImageEntry | None]:
        return [self.get(k) for k in keys]

    def put_many(self, items: Sequence[tuple[str, ImageEntry]]) -> None:
        for key, entry in items:
            self.put(key, entry)

    def contains_many(self, keys: Sequence[str]) -> list[bool]:
        return [self.contains(k) for k in keys]

    def delete_many(self, keys: Sequence[str]) -> int:
        return sum(self.delete(k) for k in keys)

    def clear(self) -> None:
        for key in list(self.keys()):
            self.delete(key)

    def close(self) -> None:  # noqa: B027 - an optional hook, deliberately not abstract
        """Release connections or files; the default has none."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.address!r})"


class Alerts:
    """Logs the first event of each kind as a warning, later ones at debug level.

    A cache that goes bad tends to go bad for many entries at once; the counters in `StoreStats`
    carry the totals, the log carries one readable line per kind.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self._seen: set[str] = set()

    def __call__(self, kind: str, message: str, *args: object) -> None:
        level = logging.DEBUG if kind in self._seen else logging.WARNING
        self._seen.add(kind)
        suffix = "" if level == logging.DEBUG else " (further ones are logged at debug level)"
        log.log(level, f"%s: {message}{suffix}", self.where, *args)

    def reset(self, kind: str) -> None:
        """Let the next event of `kind` warn again (e.g. a backend that came back and went away)."""
        self._seen.discard(kind)
