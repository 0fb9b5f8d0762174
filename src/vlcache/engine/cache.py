"""The store as one engine sees it: which dtype its keys name, lookups checked against the
model's shapes, entries built from a prefill, writes that never fail a request.

Entries live in the store on the host; what a request reads is moved to the model's device
here, and what it stores comes back to the host here (both timed in the request's stats).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from vlcache.engine.request import PreparedImage, PreparedSegment, Prompt
from vlcache.engine.stats import RequestStats
from vlcache.entry import ImageEntry
from vlcache.models.adapter import DecoderAdapter, EncodedImage
from vlcache.reuse.policy import Policy
from vlcache.reuse.prefill import PrefillOutput, SegmentInput
from vlcache.stores.base import Store, StoreStats, StoreUsage

log = logging.getLogger("vlcache.engine")


@dataclass
class Lookup:
    """What the store gave one request."""

    entries: dict[str, ImageEntry]  # usable entries by segment key (on the model's device)
    held: set[str]  # keys the store already holds with KV: a miss there is not stored again


class SegmentCache:
    """Reads and writes one model's segment entries in a store."""

    def __init__(self, store: Store, adapter: DecoderAdapter, kv_dtype: torch.dtype | None,
                 capture_hidden_at: int | None) -> None:
        self.store = store
        self._adapter = adapter
        # Keys name the dtype the store really holds, so engines sharing a store agree. A store
        # with its own kv_dtype converts (and for fp8 scales) on put; otherwise we cast here.
        self.kv_dtype = store.kv_dtype or kv_dtype or adapter.dtype
        self._put_dtype = adapter.dtype if store.kv_dtype else self.kv_dtype
        self.capture_hidden_at = capture_hidden_at

    @property
    def put_dtype(self) -> torch.dtype:
        """The dtype entries are handed to the store in (it converts further where it can)."""
        return self._put_dtype

    # --- what the server and users read ------------------------------------------------------

    @property
    def usage(self) -> StoreUsage:
        return self.store.usage

    @property
    def stats(self) -> StoreStats | None:
        return getattr(self.store, "stats", None)

    def recount(self) -> StoreUsage:
        return self.store.recount()

    def get(self, key: str) -> ImageEntry | None:
        """The entry for a segment key as stored (host tensors), or None."""
        return self.store.get(key)

    def forget(self, keys: Iterable[str]) -> None:
        """Delete these segments' entries (the next request computes and stores them anew)."""
        for key in keys:
            self.store.delete(key)

    # --- the request path --------------------------------------------------------------------

    def lookup(self, prompt: Prompt, policy: Policy, stats: RequestStats) -> Lookup:
        """The entries this policy may use, checked against the model; also which keys the
        store holds with KV (a policy that does not read the cache must not overwrite what
        others cached)."""
        kinds = {s.key: s for s in prompt.segments}
        readable = [k for k, s in kinds.items()
                    if (policy.reuse_encoder if isinstance(s, PreparedImage) else policy.reuse_kv)]
        entries: dict[str, ImageEntry] = {}
        if readable:
            t = time.perf_counter()
            for key, entry in zip(readable, self.store.get_many(readable), strict=True):
                if entry is None:
                    continue
                if self.fits(entry, kinds[key]):
                    entries[key] = self._to_device(entry)
                else:  # it would miss forever: make room for the entry this request computes
                    log.warning("cache entry %s does not match this model's shapes; treated as "
                                "a miss and replaced", key[:24])
                    self.store.delete(key)
            stats.load_s = time.perf_counter() - t
        held = {k for k, e in entries.items() if e.has_kv}
        unread = [k for k in kinds if k not in readable]
        if unread:
            held |= {k for k, c in zip(unread, self.store.contains_many(unread), strict=True)
                     if c}
        return Lookup(entries, held)

    def fits(self, entry: ImageEntry, segment: PreparedSegment) -> bool:
        """Whether an entry has the shapes this model needs for this segment."""
        a = self._adapter
        n = segment.num_tokens
        kv_ok = not entry.has_kv or tuple(entry.keys.shape) == (a.num_layers, n, a.kv_heads,
                                                                 a.head_dim)
        if isinstance(segment, PreparedImage):
            ok = entry.embeds is not None and tuple(entry.embeds.shape) == (n, a.hidden_size)
            ok = ok and (entry.deepstack is not None or a.architecture != "qwen3_vl")
        else:
            ok = entry.has_kv
        return ok and kv_ok

    def new_entries(self, prompt: Prompt, segments: list[SegmentInput], out: PrefillOutput,
                    encoded: dict[str, EncodedImage], positions: torch.Tensor,
                    contexts: list[torch.Tensor], held: set[str]
                    ) -> list[tuple[str, ImageEntry]]:
        """Entries for the segments this prefill computed in full, on the host."""
        pending, done = [], set(held)
        for i, (sp, seg) in enumerate(zip(prompt.segments, segments, strict=True)):
            if i not in out.captured or sp.key in done:
                continue
            done.add(sp.key)
            keys, values = out.captured[i]
            enc = encoded.get(sp.key)
            hidden = out.captured_hidden.get(i)
            pending.append((sp.key, ImageEntry(
                embeds=_host(enc.embeds) if enc else None,
                deepstack=_host(enc.deepstack) if enc else None,
                keys=_host(keys, self._put_dtype), values=_host(values, self._put_dtype),
                positions=_host(positions[:, seg.start:seg.start + seg.length]).clone(),
                context=_host(contexts[i]),
                hidden=None if hidden is None else _host(hidden, self._put_dtype),
                hidden_layer=None if hidden is None else torch.tensor(
                    [self.capture_hidden_at], dtype=torch.int64))))
        return pending

    def write(self, pending: list[tuple[str, ImageEntry]], stats: RequestStats) -> None:
        if not pending:
            return
        t = time.perf_counter()
        try:
            self.store.put_many(pending)
        except Exception:  # a failing store must never fail the request
            log.exception("storing %d cache entries failed", len(pending))
        stats.store_s = time.perf_counter() - t

    def _to_device(self, entry: ImageEntry) -> ImageEntry:
        device, dtype = self._adapter.device, self._adapter.dtype
        if device.type == "cpu":
            return entry

        def move(t: torch.Tensor | None, cast: bool = True) -> torch.Tensor | None:
            if t is None:
                return None
            return t.to(device, dtype=dtype if cast and t.is_floating_point() else t.dtype,
                        non_blocking=True)

        return ImageEntry(move(entry.embeds), move(entry.deepstack), move(entry.keys),
                          move(entry.values), entry.positions, entry.context,
                          hidden=move(entry.hidden), hidden_layer=entry.hidden_layer)


def _host(t: torch.Tensor | None, dtype: torch.dtype | None = None) -> torch.Tensor | None:
    if t is None:
        return None
    return t.to("cpu", dtype=dtype) if dtype is not None else t.cpu()
