"""The store interface every cache backend implements, and the address-string factory."""

from __future__ import annotations

import importlib
import logging
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from vlcache.entry import ImageEntry

if TYPE_CHECKING:
    import torch

    from vlcache.keys import ModelFingerprint

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


# scheme -> "module:factory"; a factory takes the address string and a keyword `model` (the
# model fingerprint as a string, or None) and returns a Store.
SCHEMES: dict[str, str] = {
    "memory": "vlcache.stores.memory:from_address",
    "disk": "vlcache.stores.disk:from_address",
    "redis": "vlcache.stores.redis:from_address",
    "rediss": "vlcache.stores.redis:from_address",
}


def split_tiers(address: str) -> list[str]:
    """'memory://?max_bytes=2GB+disk:///var/cache' -> its tiers, fastest first.

    Only a `+` directly followed by a registered scheme and `://` separates tiers, so a `+` inside
    a path or a password stays where it is.
    """
    schemes = "|".join(re.escape(s) for s in sorted(SCHEMES, key=len, reverse=True))
    return re.split(rf"\+(?=(?:{schemes})://)", address)


def open_store(
    address: str | Store | None = None, *, model: ModelFingerprint | str | None = None
) -> Store:
    """Open a store from an address such as `memory://?max_bytes=2GB` (None = the default).

    `model` is the fingerprint of the model whose entries the store holds; stores that keep
    entries outside this process write it into each entry's header and reject entries whose
    header names another model. Tiers are joined with `+`, fastest first (see docs/stores.md).
    """
    if isinstance(address, Store):
        return address
    address = address or "memory://"
    fingerprint = None if model is None else str(model)
    tiers = split_tiers(address)
    if len(tiers) > 1:
        from vlcache.stores.tiered import TieredStore

        return TieredStore([open_store(t, model=fingerprint) for t in tiers])
    scheme = urlsplit(address).scheme
    if scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in sorted(SCHEMES))
        raise ValueError(f"unknown store address {address!r}: expected one of {known}")
    module, _, func = SCHEMES[scheme].partition(":")
    return getattr(importlib.import_module(module), func)(address, model=fingerprint)


def parse_options(address: str, allowed: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """The query options of an address, each converted; unknown or repeated ones are errors."""
    options: dict[str, Any] = {}
    for name, value in parse_qsl(urlsplit(address).query, keep_blank_values=True):
        if name not in allowed:
            raise ValueError(
                f"unknown store option {name!r} in {address!r}: expected {sorted(allowed)}"
            )
        if name in options:
            raise ValueError(f"store option {name!r} given twice in {address!r}")
        try:
            options[name] = allowed[name](value)
        except ValueError as e:
            raise ValueError(f"store option {name}={value!r} in {address!r}: {e}") from None
    return options


_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10,
          "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_bytes(text: str) -> int:
    """'512MB', '2GiB', '1000' -> bytes."""
    t = text.strip().upper().replace("_", "")
    digits = t.rstrip("KMGTIB")
    unit = t[len(digits):]
    if unit not in _UNITS or not digits:
        raise ValueError(f"not a byte size: {text!r} (use e.g. 512MB, 2GiB)")
    return int(float(digits) * _UNITS[unit])


_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """'90', '90s', '15m', '2h', '7d' -> seconds."""
    t = text.strip().lower()
    digits = t.rstrip("smhd")
    unit = t[len(digits):]
    if unit not in _SECONDS or not digits:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 15m, 2h, 7d)")
    return float(digits) * _SECONDS[unit]


def parse_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in {"1", "true", "yes", "on"}:
        return True
    if t in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"not a boolean: {text!r}")
