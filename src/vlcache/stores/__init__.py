"""Cache stores behind one interface, opened from an address string (see docs/stores.md).

    base.py     Store interface, StoreStats counters, StoreUsage
    address.py  store addresses -> stores (open_store), tiers, option parsing
    codec.py    one entry <-> bytes: safetensors + header + checksum
    kvdtype.py  storing KV in bf16/fp16/fp8
    memory.py   in-process LRU by bytes (the default)
    disk.py     a directory of entry files: atomic writes, LRU size cap
    redis.py    Redis, chunked, TTL, degrades to misses when unreachable
    tiered.py   stores stacked fastest first
    recount.py  a background thread that keeps store.usage current
"""

from vlcache.stores.address import open_store
from vlcache.stores.base import Store, StoreStats, StoreUsage

__all__ = ["Store", "StoreStats", "StoreUsage", "open_store"]
