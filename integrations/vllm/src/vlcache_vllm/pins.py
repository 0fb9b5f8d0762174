"""Verify-then-pin: an entry is loaded and checked before vLLM's scheduler is told it exists,
and the checked tensor itself travels to the worker, so a hit can never turn into vLLM's
"Encoder cache miss" (an entry evicted, expired or damaged between the check and the load)."""

from __future__ import annotations

import torch

from vlcache_vllm.cache import EncoderCache, Expected


class Pins:
    """The entries checked during one scheduling step.

    `check` loads and pins (a hit) or reports a miss; `take` hands the pinned outputs of the
    items vLLM allocated to the step's metadata and forgets the rest (checked but not scheduled
    this step: checked again when they are).
    """

    def __init__(self, cache: EncoderCache) -> None:
        self.cache = cache
        self._pinned: dict[str, torch.Tensor] = {}  # mm_hash -> [N, W]
        self._wanted: list[str] = []

    def check(self, mm_hash: str, expected: Expected | None = None) -> bool:
        """Whether `mm_hash` is stored, intact and fits `expected`; if so it is pinned."""
        if mm_hash not in self._pinned:
            output = self.cache.load(mm_hash, expected)
            if output is None:
                return False
            self._pinned[mm_hash] = output
        return True

    def pinned(self, mm_hash: str) -> torch.Tensor | None:
        return self._pinned.get(mm_hash)

    def want(self, mm_hash: str) -> bool:
        """vLLM allocated `mm_hash` as an external load: take it this step. False if it was
        never pinned (then the worker computes it: vLLM only allocates loads for checked hits)."""
        if mm_hash not in self._pinned:
            return False
        if mm_hash not in self._wanted:
            self._wanted.append(mm_hash)
        return True

    def take(self) -> dict[str, torch.Tensor]:
        """The wanted pinned outputs; every pin is released."""
        out = {h: self._pinned[h] for h in self._wanted}
        self._pinned.clear()
        self._wanted.clear()
        return out

    @property
    def pinned_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._pinned.values())
