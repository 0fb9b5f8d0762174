"""In-memory LRU store bounded by bytes: the embedded default."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable
from typing import NamedTuple

import torch

from vlcache.entry import ImageEntry
from vlcache.stores import kvdtype
from vlcache.stores.address import parse_bytes, parse_options
from vlcache.stores.base import Store, StoreUsage, log

DEFAULT_MAX_BYTES = 2 * 10**9


class _Held(NamedTuple):
    tensors: dict[str, torch.Tensor]  # as packed by kvdtype.pack
    meta: dict[str, str]
    nbytes: int


class MemoryStore(Store):
    """Least-recently-used eviction once the held bytes pass `max_bytes`.

    Entries live in this process only, so there is no header to check: the image key already
    names the model and KV dtype. Returned tensors are shared with the store; do not modify them.
    """

    def __init__(
        self, max_bytes: int = DEFAULT_MAX_BYTES, kv_dtype: torch.dtype | str | None = None
    ) -> None:
        super().__init__()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.max_bytes = max_bytes
        self.kv_dtype = kvdtype.parse_kv_dtype(kv_dtype)
        self.address = f"memory://?max_bytes={max_bytes}"
        if self.kv_dtype is not None:
            self.address += f"&kv_dtype={kvdtype.kv_dtype_name(self.kv_dtype)}"
        self._entries: OrderedDict[str, _Held] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> ImageEntry | None:
        with self._lock:
            held = self._entries.get(key)
            if held is None:
                self.stats.misses += 1
                return None
            self._entries.move_to_end(key)
            self.stats.hits += 1
            self.stats.bytes_read += held.nbytes
        return kvdtype.unpack(held.tensors, held.meta)

    def put(self, key: str, entry: ImageEntry) -> None:
        tensors, meta = kvdtype.pack(entry, self.kv_dtype)
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if size > self.max_bytes:  # caching it would only evict everything else
            log.debug("memory store: %s (%d bytes) exceeds max_bytes", key, size)
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[key] = _Held(tensors, meta, size)
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self.stats.evictions += 1
            self.stats.puts += 1
            self.stats.bytes_written += size

    def contains(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def delete(self, key: str) -> bool:
        with self._lock:
            held = self._entries.pop(key, None)
            if held is None:
                return False
            self._bytes -= held.nbytes
            return True

    def keys(self) -> Iterable[str]:
        with self._lock:
            return list(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    @property
    def usage(self) -> StoreUsage:
        return StoreUsage(self._bytes, len(self._entries))  # exact: nothing else writes here

    def recount(self) -> StoreUsage:
        return self.usage

    @property
    def evictions(self) -> int:
        return self.stats.evictions


def from_address(address: str, model: str | None = None) -> MemoryStore:
    """`memory://?max_bytes=2GB&kv_dtype=bf16` (`model` is not needed in-process)."""
    options = parse_options(
        address, {"max_bytes": parse_bytes, "kv_dtype": kvdtype.parse_kv_dtype}
    )
    return MemoryStore(**options)
