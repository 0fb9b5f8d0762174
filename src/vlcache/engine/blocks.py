"""A prefix cache over token blocks: a repeated prompt computes only its new tail.

The prompt is cut into blocks of BLOCK tokens. Block j's key chains the key of block j-1 with
its token ids and the keys of the segments (images, documents) that overlap it, so a key names
the whole prefix up to the block's end (vLLM's block hashes, with segment keys standing in for
the pixels behind image placeholder tokens). A block entry holds the block's pre-RoPE KV at
every layer, computed exactly (behind an exactly computed prefix), so a run of cached blocks
from the start is reused with nothing recomputed, images inside it included (no vision tower).
"""

from __future__ import annotations

from dataclasses import dataclass

import blake3
import numpy as np
import torch

from vlcache.engine.cache import SegmentCache
from vlcache.engine.request import PreparedSegment, Prompt
from vlcache.entry import ImageEntry

BLOCK = 16  # tokens per block (as vLLM's default: a short tail after an image still ends a block)
PREFIX = "block-"


@dataclass
class PrefixHit:
    """The first `length` rows' exact KV ([L, length, kvh, d] each, on the model's device)."""

    length: int
    keys: torch.Tensor
    values: torch.Tensor


def block_keys(prompt: Prompt, model: str, blocks: int) -> list[str]:
    """Chained keys of the prompt's first `blocks` full blocks."""
    ids = np.ascontiguousarray(prompt.input_ids.cpu().numpy().astype(np.int64))
    parent = blake3.blake3(model.encode()).digest()
    keys = []
    for j in range(blocks):
        a, b = j * BLOCK, (j + 1) * BLOCK
        h = blake3.blake3(parent)
        h.update(ids[a:b].tobytes())
        for seg in prompt.segments:
            if seg.start < b and seg.start + seg.num_tokens > a:
                h.update(b"\0" + seg.key.encode())
        parent = h.digest()
        keys.append(PREFIX + h.hexdigest())
    return keys


def covered(prompt: Prompt, length: int) -> int:
    """The longest block-aligned prefix of at most `length` rows that cuts no segment."""
    for seg in prompt.segments:
        if seg.start < length < seg.start + seg.num_tokens:
            length = seg.start // BLOCK * BLOCK
    return length


def after(prompt: Prompt, length: int) -> list[PreparedSegment]:
    """The segments that start at or after row `length` (the rest lie inside the prefix)."""
    return [s for s in prompt.segments if s.start >= length]


class BlockCache:
    """Finds and stores a prompt's cached prefix blocks in the engine's store."""

    def __init__(self, cache: SegmentCache, model: str, num_layers: int, kv_heads: int,
                 head_dim: int, device: torch.device, dtype: torch.dtype,
                 max_tokens: int = 8192) -> None:
        self.cache = cache
        self.model = model
        self.shape = (num_layers, BLOCK, kv_heads, head_dim)
        self.device, self.dtype = device, dtype
        self.max_tokens = max_tokens  # blocks are cached up to this row of a prompt

    def keys(self, prompt: Prompt) -> list[str]:
        """The keys of every block this engine may cache of `prompt` (never its last row,
        whose logits the request needs; not past the size cap)."""
        limit = min(prompt.input_ids.shape[0] - 1, self.max_tokens) // BLOCK
        return block_keys(prompt, self.model, limit)

    def lookup(self, prompt: Prompt, keys: list[str]) -> PrefixHit | None:
        """The longest run of cached blocks from the start (`keys` from `self.keys`), cut back
        so that no segment straddles its end."""
        held = self.cache.store.contains_many(keys) if keys else []
        count = next((i for i, h in enumerate(held) if not h), len(held))
        count = covered(prompt, count * BLOCK) // BLOCK
        if count == 0:
            return None
        entries = self.cache.store.get_many(keys[:count])
        good = next((i for i, e in enumerate(entries) if not self._fits(e)), count)
        good = covered(prompt, good * BLOCK) // BLOCK
        if good == 0:
            return None
        k = torch.cat([e.keys for e in entries[:good]], dim=1)  # [L, P, kvh, d]
        v = torch.cat([e.values for e in entries[:good]], dim=1)
        return PrefixHit(good * BLOCK, k.to(self.device, self.dtype),
                         v.to(self.device, self.dtype))

    def span_to_store(self, prompt: Prompt, start: int, exact_end: int) -> tuple[int, int] | None:
        """Rows [start, end) whose blocks this request should store: whole blocks after the
        cached prefix, computed exactly, before the prompt's last row and the size cap."""
        end = min(exact_end, prompt.input_ids.shape[0] - 1, self.max_tokens) // BLOCK * BLOCK
        return (start, end) if end > start else None

    def entries(self, keys: list[str], rows: tuple[int, int],
                kv: tuple[torch.Tensor, torch.Tensor]) -> list[tuple[str, ImageEntry]]:
        """Block entries (host tensors, the store's dtype) from the captured rows' KV."""
        start, end = rows
        out = []
        for j in range(start // BLOCK, end // BLOCK):
            a = j * BLOCK - start
            k, v = (t[:, a:a + BLOCK].to("cpu", self.cache.put_dtype) for t in kv)
            out.append((keys[j], ImageEntry(keys=k.contiguous(), values=v.contiguous())))
        return out

    def _fits(self, entry: ImageEntry | None) -> bool:
        return (entry is not None and entry.has_kv and entry.embeds is None
                and tuple(entry.keys.shape) == self.shape)
