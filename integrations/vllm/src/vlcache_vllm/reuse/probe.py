"""For `LLM.collective_rpc` (runs on vLLM's worker): the reuse store's counters."""

from __future__ import annotations

from typing import Any


def reuse_counters(worker: Any) -> dict[str, int]:
    """Hits, misses, rejected entries, saves and errors of vlcache's KV entries in this
    worker, plus `reused_rows`: image rows x layers taken from entries (all steps)."""
    runner = getattr(worker, "worker", worker).model_runner
    entries = runner.vlcache_entries
    return {**entries.counters(), **runner.vlcache_rows} if entries is not None else {}
