"""Peak resident memory of one call (Linux).

Before the call we collect garbage and hand freed heap back to the OS (`malloc_trim`), then
reset the kernel's high-water mark (`/proc/self/clear_refs`, "5"); after it we read `VmHWM`.
`peak` is the whole process (weights, the store, everything), `delta` what the call added on
top of what was resident before it: its transient working memory. Where the kernel or libc
does not offer this, both are None and the report says "n/a".
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Peak:
    before: int | None = None  # resident bytes when the call starts
    peak: int | None = None  # highest resident bytes during the call

    @property
    def delta(self) -> int | None:
        return None if self.peak is None or self.before is None else self.peak - self.before


def _status_bytes(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # reported in kB
    except OSError:
        pass
    return None


def _trim() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


@contextmanager
def peak_memory() -> Iterator[Peak]:
    """Measure the resident-memory peak of the `with` body."""
    _trim()
    result = Peak()
    ok = _reset_peak()
    result.before = _status_bytes("VmRSS") if ok else None
    yield result
    result.peak = _status_bytes("VmHWM") if ok else None


def measure(fn: Callable[[], object]) -> tuple[object, Peak]:
    with peak_memory() as peak:
        out = fn()
    return out, peak
