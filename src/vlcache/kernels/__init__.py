"""vlcache's own CPU kernels (`cpu.cpp`): GQA-stacked causal attention, a fused silu*up, and
linear layers over weights packed once for MKL's sgemm (where PyTorch's BLAS is MKL).

Built once per machine and install on first use with PyTorch's C++ extension tooling (a C++
compiler and ninja; ~25 s here), into ~/.cache/vlcache/kernels/<tag>, where the tag names the
source (text and path), the torch version and the CPU's instruction sets (the build targets
the machine it runs on). Where the build fails (no compiler) or `VLCACHE_CPU_KERNELS=0`,
`cpu_kernels()` returns None and callers keep PyTorch's operators; `status()` says which and
why.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
import time
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("cpu.cpp")
ENV = "VLCACHE_CPU_KERNELS"  # "0" turns the kernels off
_lock = threading.Lock()
_state: dict[str, object] = {}


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def build_dir() -> Path:
    """Where this machine's build lives: one per source (its text and its path: PyTorch rebuilds
    a directory whose recorded source path changed), torch version and CPU flag set."""
    tag = hashlib.blake2s(b"\0".join([SOURCE.read_bytes(), str(SOURCE).encode(),
                                      torch.__version__.encode(),
                                      platform.python_version().encode(),
                                      _cpu_flags().encode()]), digest_size=8).hexdigest()
    root = Path(os.environ.get("VLCACHE_KERNEL_CACHE",
                               Path.home() / ".cache" / "vlcache" / "kernels"))
    return root / tag


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load  # imports setuptools: only when building

    where = build_dir()
    where.mkdir(parents=True, exist_ok=True)
    fresh = not any(where.glob("*.so"))
    if fresh:
        log.warning("building vlcache's CPU kernels into %s (once per machine and install, "
                    "~25 s here)", where)
    start = time.perf_counter()
    module = load(name="vlcache_cpu_kernels", sources=[str(SOURCE)], build_directory=str(where),
                  extra_cflags=["-O3", "-march=native", "-fopenmp"],
                  extra_ldflags=["-fopenmp"], verbose=False)
    if fresh:
        log.warning("built vlcache's CPU kernels in %.0f s", time.perf_counter() - start)
    return module


def cpu_kernels() -> ModuleType | None:
    """The built kernels, or None where they are off or cannot be built (built once a
    process; a failed build is not retried)."""
    if "module" in _state:
        return _state["module"]  # type: ignore[return-value]
    with _lock:
        if "module" not in _state:
            module, why = None, "ok"
            if os.environ.get(ENV, "1") == "0":
                why = f"off ({ENV}=0)"
            else:
                try:
                    module = _build()
                except Exception as exc:  # no compiler, no ninja, a failed compile
                    why = f"build failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
                    log.warning("vlcache's CPU kernels are unavailable, using PyTorch's "
                                "operators instead (%s)", why)
            _state["why"] = why
            _state["module"] = module
    return _state["module"]  # type: ignore[return-value]


def status() -> str:
    """'ok', 'off (...)', 'build failed: ...', or 'not loaded' before the first call."""
    return str(_state.get("why", "not loaded"))


def usable(*tensors: torch.Tensor) -> bool:
    """True where the kernels apply: fp32 tensors on the CPU, and the kernels built."""
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and cpu_kernels() is not None)
