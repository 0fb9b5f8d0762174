"""Cache stores behind one interface, opened from an address string (see docs/stores.md).

    base.py     Store interface, StoreStats counters, address parsing, open_store
    codec.py    one entry <-> bytes: safetensors + header + checksum
    kvdtype.py  storing KV in bf16/fp16/fp8
    memory.py   in-process LRU by bytes (the default)
    disk.py     a directory of entry files: atomic writes, LRU size cap
    redis.py    Redis, chunked, TTL, degrades to misses when unreachable
    tiered.py   stores stacked fastest first
"""

from vlcache.stores.base import Store, StoreStats, open_store

__all__ = ["Store", "StoreStats", "open_store"]
