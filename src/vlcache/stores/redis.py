"""Redis: one cache shared by every engine process that can reach the server.

An entry is serialised (codec.py) and split into chunks of `chunk_bytes`; the chunks go under
keys private to this write (`<prefix>c:<key>:<nonce>:<i>`) and the manifest naming them
(`<prefix>e:<key>`) is written last, so a reader finds either no manifest, an old complete
entry, or the new complete one. A writer that dies mid-put leaves only unreferenced chunks,
which expire. An overwritten entry's chunks are given a short grace TTL rather than deleted, so
a reader that already holds the old manifest can finish.

When Redis is unreachable every call degrades (get -> miss, put -> skipped) with one warning and
a counter, and for `retry` seconds calls do not even try; after that the next call reconnects.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import torch

from vlcache.entry import ImageEntry
from vlcache.stores import codec, kvdtype
from vlcache.stores.address import parse_bytes, parse_duration, parse_options
from vlcache.stores.base import Alerts, Store, StoreUsage, log

DEFAULT_CHUNK_BYTES = 4 * 2**20
CHUNK_TTL_MARGIN_S = 60  # chunks outlive their manifest, so an unexpired manifest has its chunks
GRACE_S = 30  # an overwritten entry's chunks stay this long for readers already under way
SCAN_BATCH = 1000  # manifests per SCAN step and per MGET when counting
T = TypeVar("T")

# Delete a manifest only if it is still the one we judged bad (another writer may have replaced
# it with a good entry since), and expire its chunks.
_DELETE_IF_SAME = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  for i = 2, #KEYS do redis.call('DEL', KEYS[i]) end
  return 1
end
return 0
"""


class RedisStore(Store):
    """Entries in Redis, chunked, with a TTL; unreachable Redis turns into misses."""

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        ttl: float | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        prefix: str = "vlcache:",
        timeout: float = 2.0,
        retry: float = 2.0,
        kv_dtype: torch.dtype | str | None = None,
        model: str | None = None,
    ) -> None:
        super().__init__()
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ImportError(
                "the Redis store needs the redis client: pip install 'vlcache[redis]'"
            ) from None
        if chunk_bytes <= 0:
            raise ValueError("chunk_bytes must be positive")
        self.ttl = int(ttl) if ttl else None
        self.chunk_bytes = chunk_bytes
        self.prefix = prefix
        self.retry = retry
        self.kv_dtype = kvdtype.parse_kv_dtype(kv_dtype)
        self.model = model
        self.address = _public_url(url, ttl=self.ttl, chunk_bytes=chunk_bytes, kv=self.kv_dtype)
        self._failures = (redis.ConnectionError, redis.TimeoutError, OSError)
        self._redis_error = redis.RedisError
        # one quick retry: a pooled connection broken by a server restart reconnects at once
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            retry=Retry(NoBackoff(), 1),
        )
        self._delete_if_same = self._client.register_script(_DELETE_IF_SAME)
        self._down_until = 0.0
        self._down = False
        self._alerts = Alerts(f"redis store {self.address}")
        self._usage_lock = threading.Lock()  # puts run on one thread, recounts on another

    @property
    def available(self) -> bool:
        """False while Redis is known to be down (until the next reconnect attempt)."""
        return not self._down

    # -- the Store interface

    def get(self, key: str) -> ImageEntry | None:
        entry = self._call(lambda r: self._get(r, key), None)
        if entry is None:
            self.stats.misses += 1
        return entry

    def put(self, key: str, entry: ImageEntry) -> None:
        blob = codec.encode(key, entry, self.model, self.kv_dtype)
        if self._call(lambda r: self._put(r, key, blob), False):
            self.stats.puts += 1
            self.stats.bytes_written += len(blob)

    def contains(self, key: str) -> bool:
        return bool(self._call(lambda r: r.exists(self._manifest_key(key)), 0))

    def delete(self, key: str) -> bool:
        def delete(r: Any) -> bool:
            raw = r.get(self._manifest_key(key))
            if raw is None:
                return False
            return self._delete(key, raw)

        return bool(self._call(delete, False))

    def keys(self) -> Iterable[str]:
        start = len(self.prefix) + 2
        found = self._call(lambda r: list(r.scan_iter(match=self._manifest_key("*"))), [])
        return [k.decode()[start:] for k in found]

    @property
    def nbytes(self) -> int:
        return self._call(lambda r: self._count(r).bytes, 0)

    def recount(self) -> StoreUsage:
        """Every manifest under this prefix, whoever wrote it (a SCAN and MGETs in batches)."""
        counted = self._call(self._count, None)
        if counted is not None:
            with self._usage_lock:
                self._usage = counted
        return self.usage

    def clear(self) -> None:
        """Delete every key under this store's prefix (orphaned chunks included)."""

        def clear(r: Any) -> None:
            batch = []
            for k in r.scan_iter(match=f"{self.prefix}*", count=1000):
                batch.append(k)
                if len(batch) >= 1000:
                    r.delete(*batch)
                    batch = []
            if batch:
                r.delete(*batch)

        self._call(clear, None)

    def close(self) -> None:
        self._client.close()

    # -- usage: this process's own puts and deletes between recounts

    def _count(self, r: Any) -> StoreUsage:
        total = StoreUsage()
        batch: list[bytes] = []
        for name in r.scan_iter(match=self._manifest_key("*"), count=SCAN_BATCH):
            batch.append(name)
            if len(batch) >= SCAN_BATCH:
                total, batch = total + _held(r.mget(batch)), []
        return total + _held(r.mget(batch)) if batch else total

    def _track(self, put: int | None, replaced: bytes | None) -> None:
        """Account a put of `put` bytes (None: a delete) that replaced the manifest `replaced`."""
        new = StoreUsage() if put is None else StoreUsage(put, 1)
        gone = StoreUsage() if replaced is None else StoreUsage(_manifest_size(replaced), 1)
        with self._usage_lock:
            u = self._usage
            self._usage = StoreUsage(max(u.bytes + new.bytes - gone.bytes, 0),
                                     max(u.entries + new.entries - gone.entries, 0))

    # -- one entry

    def _manifest_key(self, key: str) -> str:
        return f"{self.prefix}e:{key}"

    def _chunk_keys(self, key: str, nonce: str, count: int) -> list[str]:
        return [f"{self.prefix}c:{key}:{nonce}:{i}" for i in range(count)]

    def _entry_keys(self, key: str, raw_manifest: bytes) -> list[str]:
        """The manifest's key and, if it parses, its chunks' keys."""
        try:
            m = json.loads(raw_manifest)
            return [self._manifest_key(key)] + self._chunk_keys(key, m["nonce"], m["chunks"])
        except (ValueError, KeyError, TypeError):
            return [self._manifest_key(key)]

    def _get(self, r: Any, key: str) -> ImageEntry | None:
        raw = r.get(self._manifest_key(key))
        if raw is None:
            return None
        try:
            m = json.loads(raw)
            chunks = r.mget(self._chunk_keys(key, m["nonce"], m["chunks"]))
            size = int(m["size"])
        except (ValueError, KeyError, TypeError):
            return self._reject(r, key, raw, "unreadable manifest")
        if any(c is None for c in chunks):
            # Either an overwrite replaced the manifest after we read it (then leave the new
            # entry alone) or Redis evicted or expired a chunk (then the entry is broken).
            return self._reject(r, key, raw, "missing chunk")
        blob = b"".join(chunks)
        if len(blob) != size:
            return self._reject(r, key, raw, f"{len(blob)} bytes, manifest says {size}")
        try:
            entry = codec.decode(blob, key, self.model, self.kv_dtype)
        except codec.BadEntry as e:
            return self._reject(r, key, raw, e.reason)
        self.stats.hits += 1
        self.stats.bytes_read += len(blob)
        return entry

    def _put(self, r: Any, key: str, blob: bytes) -> bool:
        nonce = os.urandom(8).hex()
        view = memoryview(blob)
        starts = range(0, max(len(blob), 1), self.chunk_bytes)
        chunk_ttl = self.ttl + CHUNK_TTL_MARGIN_S if self.ttl else None
        pipe = r.pipeline(transaction=False)
        for name, start in zip(self._chunk_keys(key, nonce, len(starts)), starts, strict=True):
            pipe.set(name, view[start : start + self.chunk_bytes].tobytes(), ex=chunk_ttl)
        pipe.execute()
        manifest = json.dumps({"nonce": nonce, "chunks": len(starts), "size": len(blob)})
        old = self._publish(r, key, manifest)
        self._track(len(blob), old)
        return True

    def _publish(self, r: Any, key: str, manifest: str) -> bytes | None:
        """Point the entry at the new chunks (the commit point), then retire the old chunks;
        the manifest replaced, if any."""
        old = r.set(self._manifest_key(key), manifest, ex=self.ttl, get=True)
        if old is not None:
            stale = self._entry_keys(key, old)[1:]
            if stale:
                pipe = r.pipeline(transaction=False)
                for name in stale:
                    pipe.expire(name, GRACE_S)
                pipe.execute()
        return old

    def _delete(self, key: str, raw: bytes) -> bool:
        """Delete the entry if `raw` is still its manifest."""
        done = bool(self._delete_if_same(keys=self._entry_keys(key, raw), args=[raw]))
        if done:
            self._track(None, raw)
        return done

    def _reject(self, r: Any, key: str, raw: bytes, reason: str) -> None:
        if r.get(self._manifest_key(key)) != raw:
            return None  # replaced while we read: a race with a writer, not a bad entry
        self.stats.corrupt += 1
        self._alerts("corrupt", "rejected %s (%s), removed", key, reason)
        self._delete(key, raw)
        return None

    # -- availability

    def _call(self, fn: Callable[[Any], T], default: T) -> T:
        if self._down and time.monotonic() < self._down_until:
            self.stats.unavailable += 1
            return default
        try:
            result = fn(self._client)
        except self._failures as e:
            self.stats.errors += 1
            self._down_until = time.monotonic() + self.retry
            if not self._down:
                self._down = True
                self._alerts.reset("down")
                self._alerts("down", "unreachable, serving misses (retrying every %gs): %s",
                             self.retry, e)
            return default
        except self._redis_error as e:  # e.g. out of memory: this call fails, Redis is up
            self.stats.errors += 1
            self._alerts("error", "%s", e)
            return default
        if self._down:
            self._down = False
            log.warning("redis store %s: reachable again", self.address)
        return result


def _held(manifests: list[bytes | None]) -> StoreUsage:
    found = [m for m in manifests if m is not None]  # None: expired since the SCAN saw it
    return StoreUsage(sum(_manifest_size(m) for m in found), len(found))


def _manifest_size(raw: bytes) -> int:
    try:
        return int(json.loads(raw)["size"])
    except (ValueError, KeyError, TypeError):
        return 0


def _public_url(url: str, ttl: int | None, chunk_bytes: int, kv: torch.dtype | None) -> str:
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]  # no credentials in logs or metrics labels
    query = [f"chunk_bytes={chunk_bytes}"] + ([f"ttl={ttl}"] if ttl else [])
    if kv is not None:
        query.append(f"kv_dtype={kvdtype.kv_dtype_name(kv)}")
    return urlunsplit((parts.scheme, netloc, parts.path, "&".join(query), ""))


_OPTIONS = {
    "ttl": parse_duration,
    "chunk_bytes": parse_bytes,
    "prefix": str,
    "timeout": parse_duration,
    "retry": parse_duration,
    "kv_dtype": kvdtype.parse_kv_dtype,
}


def from_address(address: str, model: str | None = None) -> RedisStore:
    """`redis://[user:password@]host:port/db?ttl=7d&chunk_bytes=4MB&prefix=vlcache:&...`."""
    options = parse_options(address, _OPTIONS)
    parts = urlsplit(address)
    url = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    return RedisStore(url, model=model, **options)
