"""A directory of serialised entries: survives restarts, shared by processes on one machine.

Each entry is one file `<key>.vlc` (see codec.py for its layout). A put writes a temporary file
in the same directory and renames it over the entry, so a reader sees the old file or the new
one, never half of either, and two processes writing the same key both leave a whole entry.
A file's mtime is its last use (a hit touches it); when the directory grows past `max_bytes`
the least recently used files are deleted down to `LOW_WATER * max_bytes`.
"""

from __future__ import annotations

import os
import re
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO, NamedTuple
from urllib.parse import unquote, urlsplit

import torch

from vlcache.entry import ImageEntry
from vlcache.stores import codec, kvdtype
from vlcache.stores.address import parse_bool, parse_bytes, parse_options
from vlcache.stores.base import Alerts, Store, StoreUsage, log

DEFAULT_MAX_BYTES = 20 * 10**9
SUFFIX = ".vlc"
TMP_SUFFIX = ".tmp"
LOW_WATER = 0.9  # evict to 90% so that a full cache does not rescan on every put
RESCAN_S = 30.0  # other processes write here too: recount at least this often while putting
STALE_TMP_S = 600.0  # a temporary file this old belongs to a writer that died
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


class _File(NamedTuple):
    mtime: float
    size: int
    path: str


class DiskStore(Store):
    """Entries as files in one directory, with checksums, atomic writes and an LRU size cap."""

    def __init__(
        self,
        root: str | os.PathLike,
        max_bytes: int = DEFAULT_MAX_BYTES,
        kv_dtype: torch.dtype | str | None = None,
        model: str | None = None,
        fsync: bool = False,
    ) -> None:
        super().__init__()
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.root = Path(root).expanduser().absolute()
        self.max_bytes = max_bytes
        self.kv_dtype = kvdtype.parse_kv_dtype(kv_dtype)
        self.model = model
        self.fsync = fsync
        self.address = f"disk://{self.root}?max_bytes={max_bytes}"
        if self.kv_dtype is not None:
            self.address += f"&kv_dtype={kvdtype.kv_dtype_name(self.kv_dtype)}"
        self._alerts = Alerts(f"disk store {self.root}")
        self._lock = threading.Lock()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.stats.errors += 1
            self._alerts("write", "cannot create the directory, puts will be skipped: %s", e)
        self._approx_bytes = 0  # this process's count: its own puts and deletes, and each scan
        self._approx_entries = 0
        self._last_scan = 0.0
        self._scan(evict=True)

    # -- the Store interface

    def get(self, key: str) -> ImageEntry | None:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                blob = f.read()
                inode = os.fstat(f.fileno()).st_ino
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        except OSError as e:
            self.stats.errors += 1
            self.stats.misses += 1
            self._alerts("read", "cannot read %s: %s", path.name, e)
            return None
        try:
            entry = codec.decode(blob, key, self.model, self.kv_dtype)
        except codec.BadEntry as e:
            self._reject(path, inode, len(blob), e)
            return None
        self._touch(path)
        self.stats.hits += 1
        self.stats.bytes_read += len(blob)
        return entry

    def put(self, key: str, entry: ImageEntry) -> None:
        path = self._path(key)
        blob = codec.encode(key, entry, self.model, self.kv_dtype)
        if len(blob) > self.max_bytes:  # caching it would only evict everything else
            log.debug("disk store %s: %s (%d bytes) exceeds max_bytes", self.root, key, len(blob))
            return
        old = _size(path)
        try:
            self._write_atomic(path, blob)
        except OSError as e:
            self.stats.errors += 1
            self._alerts("write", "put %s skipped: %s", key, e)
            return
        self.stats.puts += 1
        self.stats.bytes_written += len(blob)
        with self._lock:
            self._approx_bytes += len(blob) - (old or 0)
            self._approx_entries += old is None
            if (
                self._approx_bytes > self.max_bytes
                or time.monotonic() - self._last_scan > RESCAN_S
            ):
                self._scan(evict=True)

    def contains(self, key: str) -> bool:
        return self._path(key).is_file()

    def delete(self, key: str) -> bool:
        path = self._path(key)
        size = _size(path)
        try:
            os.unlink(path)
            self._forget(size or 0)
            return True
        except FileNotFoundError:
            return False
        except OSError as e:
            self.stats.errors += 1
            self._alerts("delete", "cannot delete %s: %s", key, e)
            return False

    def keys(self) -> Iterable[str]:
        return [Path(f.path).name[: -len(SUFFIX)] for f in self._files()]

    @property
    def nbytes(self) -> int:
        return sum(f.size for f in self._files())

    @property
    def usage(self) -> StoreUsage:
        return StoreUsage(max(self._approx_bytes, 0), max(self._approx_entries, 0))

    def recount(self) -> StoreUsage:
        files = self._files()  # outside the lock: a large directory takes a while
        with self._lock:
            self._approx_bytes = sum(f.size for f in files)
            self._approx_entries = len(files)
        return self.usage

    # -- files

    def _path(self, key: str) -> Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"disk store keys are [A-Za-z0-9._-], at most 201 chars: {key!r}")
        return self.root / f"{key}{SUFFIX}"

    def _write_atomic(self, path: Path, blob: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{path.stem}.", suffix=TMP_SUFFIX)
        try:
            with os.fdopen(fd, "wb") as f:
                self._write(f, blob)
                if self.fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # mkstemp makes it private; other readers share the cache
            os.replace(tmp, path)
            if self.fsync:  # the rename itself survives power loss once the directory is synced
                dir_fd = os.open(self.root, os.O_RDONLY)
                try:
                    os.fsync(dir_fd)
                finally:
                    os.close(dir_fd)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def _write(self, f: BinaryIO, blob: bytes) -> None:
        f.write(blob)

    def _touch(self, path: Path) -> None:
        try:
            os.utime(path)
        except OSError:
            pass  # a read-only cache still serves hits; it just cannot record their recency

    def _reject(self, path: Path, inode: int, size: int, error: codec.BadEntry) -> None:
        self.stats.corrupt += 1
        self.stats.misses += 1
        self._alerts("corrupt", "rejected %s (%s), removed", path.name, error.reason)
        try:
            if os.stat(path).st_ino == inode:  # not a good entry renamed in since we read it
                os.unlink(path)
                self._forget(size)
        except OSError:
            pass

    def _forget(self, size: int) -> None:
        with self._lock:
            self._approx_bytes -= size
            self._approx_entries -= 1

    def _files(self) -> list[_File]:
        files = []
        now = time.time()
        try:
            entries = list(os.scandir(self.root))
        except OSError:
            return []
        for de in entries:
            try:
                st = de.stat()
            except OSError:
                continue
            if de.name.endswith(TMP_SUFFIX) and now - st.st_mtime > STALE_TMP_S:
                _unlink_quietly(de.path)
            elif de.name.endswith(SUFFIX) and not de.name.startswith("."):
                files.append(_File(st.st_mtime, st.st_size, de.path))
        return files

    def _scan(self, evict: bool) -> None:
        """Recount the directory (all writers' files) and evict the least recently used."""
        files = self._files()
        total, count = sum(f.size for f in files), len(files)
        if evict and total > self.max_bytes:
            target = int(self.max_bytes * LOW_WATER)
            for f in sorted(files):
                if total <= target:
                    break
                if _unlink_quietly(f.path):
                    self.stats.evictions += 1
                total, count = total - f.size, count - 1
        self._approx_bytes, self._approx_entries = total, count
        self._last_scan = time.monotonic()


def _size(path: Path) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _unlink_quietly(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


def from_address(address: str, model: str | None = None) -> DiskStore:
    """`disk:///abs/dir?max_bytes=50GB&kv_dtype=bf16&fsync=1` (`disk://rel/dir` is relative)."""
    parts = urlsplit(address)
    root = unquote(parts.netloc + parts.path)
    if not root:
        raise ValueError(f"disk store address needs a directory: {address!r}")
    options = parse_options(
        address,
        {"max_bytes": parse_bytes, "kv_dtype": kvdtype.parse_kv_dtype, "fsync": parse_bool},
    )
    return DiskStore(root, model=model, **options)
