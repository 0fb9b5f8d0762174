"""Encoder outputs in a vlcache store, one entry per image, checked on every load.

An entry is the tensor vLLM hands over, as it is (`[N, W]`: W is the LM hidden size for
Qwen2/2.5-VL, wider for Qwen3-VL, whose deepstack features ride on the last dimension), in
vlcache's entry format: safetensors with a header (key, model) and a blake3 digest
(vlcache.stores.codec). A truncated, bit-flipped or foreign entry is a miss, counted and
removed by the store; it never raises.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import torch

from vlcache.entry import ImageEntry
from vlcache.stores import Store, open_store
from vlcache.stores.address import split_tiers
from vlcache_vllm.keys import EncoderKey
from vlcache_vllm.metrics import CacheMetrics

log = logging.getLogger("vlcache_vllm")

IN_PROCESS_SCHEMES = frozenset({"memory"})


@dataclass(frozen=True)
class Expected:
    """What the model's encoder gives, so an intact entry that does not fit is a miss:
    `dtype` the model's, `widths` the last dimensions it may have (empty: any)."""

    dtype: torch.dtype | None = None
    widths: frozenset[int] = field(default_factory=frozenset)

    def problem(self, output: torch.Tensor) -> str | None:
        if output.dim() < 2:
            return f"shape {tuple(output.shape)} is not [tokens, ..., width]"
        if self.dtype is not None and output.dtype != self.dtype:
            return f"dtype {output.dtype}, the model gives {self.dtype}"
        if self.widths and output.shape[-1] not in self.widths:
            return f"width {output.shape[-1]}, the model gives {sorted(self.widths)}"
        return None


def check_shared(address: str) -> None:
    """Refuse an address no other process can read: vLLM's scheduler (which decides hits) and
    its workers (which save) are separate processes, so a `memory://` store would never hit."""
    schemes = {urlsplit(tier).scheme for tier in split_tiers(address)}
    if schemes and schemes <= IN_PROCESS_SCHEMES:
        raise ValueError(
            f"store address {address!r} keeps entries inside one process, but vLLM's scheduler "
            "and its workers are separate processes: use a store they share, e.g. "
            "disk:///var/cache/vlcache-ec, redis://host:6379/0, or memory://+disk:///path"
        )


class EncoderCache:
    """Encoder outputs keyed by vLLM's mm_hash and a model fingerprint, in any vlcache store.

    `load` and `save` never raise: a damaged, foreign or unreadable entry is a miss, a failed
    save is logged and skipped. Counters are in `metrics`.
    """

    def __init__(self, store: Store, model: str) -> None:
        self.store = store
        self.model = model
        self.metrics = CacheMetrics()

    @classmethod
    def open(cls, address: str, model: str) -> EncoderCache:
        """A cache over the store at `address` (see vlcache's docs/stores.md); the store rejects
        entries whose header names another model."""
        check_shared(address)
        return cls(open_store(address, model=model), model)

    def key(self, mm_hash: str) -> str:
        return str(EncoderKey(mm_hash, self.model))

    def load(self, mm_hash: str, expected: Expected | None = None) -> torch.Tensor | None:
        """The stored encoder output for `mm_hash`, checked (digest, header, `expected`), or
        None."""
        start = time.perf_counter()
        try:
            return self._load(mm_hash, expected or Expected())
        except Exception as e:  # a store bug must not become an engine error
            self.metrics.errors += 1
            self.metrics.misses += 1
            log.warning("encoder cache: loading %s failed, a miss: %r", mm_hash, e)
            return None
        finally:
            self.metrics.load_seconds += time.perf_counter() - start

    def _load(self, mm_hash: str, expected: Expected) -> torch.Tensor | None:
        key = self.key(mm_hash)
        corrupt_before = self.store.stats.corrupt
        entry = self.store.get(key)
        if entry is None:
            self.metrics.misses += 1
            if self.store.stats.corrupt > corrupt_before:
                self.metrics.damaged += 1
            return None
        output = entry.embeds
        problem = ("not an encoder output" if output is None or entry.has_kv
                   else expected.problem(output))
        if problem is not None:
            self.metrics.rejected += 1
            self.metrics.misses += 1
            log.warning("encoder cache: entry for %s does not fit the model (%s), a miss",
                        mm_hash, problem)
            return None
        self.metrics.hits += 1
        self.metrics.bytes_loaded += output.numel() * output.element_size()
        return output

    def save(self, mm_hash: str, output: torch.Tensor) -> bool:
        """Hand `output` ([N, W]) to the store; False (logged) when it could not be."""
        start = time.perf_counter()
        try:
            output = output.detach().to("cpu").contiguous()  # [N, W]
            self.store.put(self.key(mm_hash), ImageEntry(embeds=output))
        except Exception as e:
            self.metrics.errors += 1
            log.warning("encoder cache: saving %s failed, skipped: %r", mm_hash, e)
            return False
        finally:
            self.metrics.save_seconds += time.perf_counter() - start
        self.metrics.saves += 1
        self.metrics.bytes_saved += output.numel() * output.element_size()
        return True

    def close(self) -> None:
        self.store.close()
