"""Keep freed host memory in the process (glibc): large tensors stop paying page faults.

glibc serves allocations above 32 MB (at most; the threshold adapts) with fresh `mmap`s and
returns them to the OS when freed, and a thread other than the main one allocates from an
arena whose heaps hold at most 64 MB, so every [rows x 9,728] activation of a long prefill is
faulted in page by page again (`benchmarks/host_memory.py` measures what that costs). With the
mmap and trim thresholds raised and one arena for every thread (the server's model thread
included), large blocks come from the heap and stay there once freed, as tcmalloc and jemalloc
keep them (vLLM's CPU docs preload tcmalloc for this). The process's resident memory then
stays at its peak; `VLCACHE_KEEP_FREED_MEMORY=0` leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os

log = logging.getLogger(__name__)

ENV = "VLCACHE_KEEP_FREED_MEMORY"  # "0" leaves glibc's defaults
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8  # glibc's mallopt parameters
THRESHOLD = 1 << 30  # bytes: allocations up to 1 GB from the heap, 1 GB free at its top kept
_done: list[bool] = []


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds and keep one arena, for this process (once);
    True where it took effect, False off glibc or with VLCACHE_KEEP_FREED_MEMORY=0."""
    if _done:
        return _done[0]
    ok = False
    if os.environ.get(ENV, "1") != "0":
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            mallopt = libc.mallopt
        except (OSError, AttributeError):  # not glibc (macOS, musl without mallopt)
            mallopt = None
        if mallopt is not None:
            ok = all([mallopt(M_MMAP_THRESHOLD, THRESHOLD), mallopt(M_TRIM_THRESHOLD, THRESHOLD),
                      mallopt(M_ARENA_MAX, 1)])
            if not ok:
                log.info("glibc refused the malloc thresholds; keeping its defaults")
    _done.append(ok)
    return ok
