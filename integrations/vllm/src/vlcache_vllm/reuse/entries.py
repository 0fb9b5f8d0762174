"""An image's language-model KV (pre-RoPE keys, values, per layer) in a vlcache store, keyed
as the encoder cache keys things: vLLM's mm_hash and the model fingerprint.

A damaged, foreign or misshapen entry is a miss (the image is then computed in full and saved
again); loads and saves never raise into vLLM.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from vlcache.entry import ImageEntry
from vlcache.stores import Store, open_store
from vlcache_vllm.cache import check_shared
from vlcache_vllm.keys import EncoderKey

log = logging.getLogger("vlcache_vllm")

KEY_VERSION = "kv1"
PREFIX = "kv-"  # beside the encoder cache's "ec-" keys in the same store


class KVKey(EncoderKey):
    """The KV of one image: vLLM's mm_hash and the model fingerprint (weights, dtype), keyed
    as the encoder cache keys its output, under its own prefix."""

    PREFIX = PREFIX
    VERSION = KEY_VERSION
    WHAT = "a KV key"


@dataclass(frozen=True)
class KVShape:
    """What the model's layers give per image token: `layers` x [kv_heads, head_dim]."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    def problem(self, entry: ImageEntry, num_tokens: int) -> str | None:
        if not entry.has_kv:
            return "no KV in the entry"
        want = (self.layers, num_tokens, self.kv_heads, self.head_dim)
        if tuple(entry.keys.shape) != want:
            return f"KV shape {tuple(entry.keys.shape)}, the model needs {want}"
        if entry.keys.dtype != self.dtype:
            return f"KV dtype {entry.keys.dtype}, the model runs {self.dtype}"
        return None


class KVEntries:
    """Images' pre-RoPE KV in any shared vlcache store (disk, Redis, tiers)."""

    def __init__(self, store: Store, model: str) -> None:
        self.store = store
        self.model = model
        self.hits = self.misses = self.rejected = self.saves = self.errors = 0

    @classmethod
    def open(cls, address: str, model: str) -> KVEntries:
        check_shared(address)
        return cls(open_store(address, model=model), model)

    def key(self, mm_hash: str) -> str:
        return str(KVKey(mm_hash, self.model))

    def load(self, mm_hash: str, num_tokens: int, shape: KVShape) -> ImageEntry | None:
        try:
            entry = self.store.get(self.key(mm_hash))
        except Exception as e:  # a store bug must not become an engine error
            self.errors += 1
            log.warning("vlcache KV: loading %s failed, a miss: %r", mm_hash, e)
            entry = None
        if entry is None:
            self.misses += 1
            return None
        problem = shape.problem(entry, num_tokens)
        if problem is not None:
            self.rejected += 1
            self.misses += 1
            log.warning("vlcache KV: entry for %s does not fit (%s), a miss", mm_hash, problem)
            return None
        self.hits += 1
        return entry

    def save(self, mm_hash: str, keys: torch.Tensor, values: torch.Tensor,
             positions: torch.Tensor) -> bool:
        """keys/values [L, N, kvh, d] pre-RoPE; positions [3, N] where they were computed."""
        try:
            entry = ImageEntry(keys=keys.contiguous(), values=values.contiguous(),
                               positions=positions.to(torch.int64).contiguous())
            self.store.put(self.key(mm_hash), entry)
        except Exception as e:
            self.errors += 1
            log.warning("vlcache KV: saving %s failed, skipped: %r", mm_hash, e)
            return False
        self.saves += 1
        return True

    def counters(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "rejected": self.rejected,
                "saves": self.saves, "errors": self.errors}
