"""A prefix cache over token blocks: a repeated prompt computes only its new tail.

The prompt is cut into blocks of BLOCK tokens, and also where each segment (image, document)
starts, so the text before a segment is a block of its own: a known system prompt in front of
a new image is reused (vLLM's blocks are whole, so its prefix cache stops at the last full block
before the image). Block j's key chains the key of block j-1 with its token ids and the keys of
the segments that overlap it, so a key names the whole prefix up to the block's end (vLLM's
block hashes, with segment keys standing in for the pixels behind image placeholder tokens).
A cut at a segment's start is part of the prefix it ends (the segment's placeholder tokens
begin there), so the same prefix is cut the same way in every prompt. A block entry holds the
block's pre-RoPE KV at every layer, computed exactly (behind an exactly computed prefix), so a
run of cached blocks from the start is reused with nothing recomputed, images inside it
included (no vision tower).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import blake3
import numpy as np
import torch

from vlcache.engine.cache import SegmentCache
from vlcache.engine.request import PreparedSegment, Prompt
from vlcache.entry import ImageEntry

BLOCK = 16  # tokens per block at most (as vLLM's default: a short tail after an image ends one)
PREFIX = "block-"


@dataclass
class PrefixHit:
    """The first `length` rows' exact KV ([L, length, kvh, d] each, on the model's device)."""

    length: int
    keys: torch.Tensor
    values: torch.Tensor


def block_ends(prompt: Prompt, limit: int) -> list[int]:
    """Where the blocks of the prompt's first `limit` rows end: every BLOCK rows and at each
    segment's start (a run of rows after the last cut is not a block)."""
    cuts = set(range(BLOCK, limit + 1, BLOCK))
    cuts.update(s.start for s in prompt.segments if 0 < s.start <= limit)
    return sorted(cuts)


def block_keys(prompt: Prompt, model: str, ends: list[int]) -> list[str]:
    """Chained keys of the blocks that end at `ends` (from `block_ends`)."""
    ids = np.ascontiguousarray(prompt.input_ids.cpu().numpy().astype(np.int64))
    parent = blake3.blake3(model.encode()).digest()
    keys = []
    for a, b in zip([0, *ends], ends, strict=False):
        h = blake3.blake3(parent)
        h.update(ids[a:b].tobytes())
        for seg in prompt.segments:
            if seg.start < b and seg.start + seg.num_tokens > a:
                h.update(b"\0" + seg.key.encode())
        parent = h.digest()
        keys.append(PREFIX + h.hexdigest())
    return keys


def covered(prompt: Prompt, length: int) -> int:
    """The longest prefix of at most `length` rows that cuts no segment (a segment's start is
    a block end, so the result still is one)."""
    for seg in prompt.segments:
        if seg.start < length < seg.start + seg.num_tokens:
            length = seg.start
    return length


def after(prompt: Prompt, length: int) -> list[PreparedSegment]:
    """The segments that start at or after row `length` (the rest lie inside the prefix)."""
    return [s for s in prompt.segments if s.start >= length]


@dataclass(frozen=True)
class PromptBlocks:
    """A prompt's cacheable blocks: block j is rows [ends[j-1], ends[j]) (ends[-1] = 0)."""

    keys: list[str]
    ends: list[int]

    def __bool__(self) -> bool:
        return bool(self.keys)

    def count_within(self, length: int) -> int:
        """How many blocks lie wholly within the first `length` rows."""
        return bisect.bisect_right(self.ends, length)

    def length(self, count: int) -> int:
        """The rows covered by the first `count` blocks."""
        return self.ends[count - 1] if count else 0


class BlockCache:
    """Finds and stores a prompt's cached prefix blocks in the engine's store."""

    def __init__(self, cache: SegmentCache, model: str, num_layers: int, kv_heads: int,
                 head_dim: int, device: torch.device, dtype: torch.dtype,
                 max_tokens: int = 8192) -> None:
        self.cache = cache
        self.model = model
        self.shape = (num_layers, kv_heads, head_dim)  # an entry is [L, rows, kvh, d]
        self.device, self.dtype = device, dtype
        self.max_tokens = max_tokens  # blocks are cached up to this row of a prompt

    def blocks(self, prompt: Prompt) -> PromptBlocks:
        """Every block this engine may cache of `prompt` (never its last row, whose logits the
        request needs; not past the size cap)."""
        ends = block_ends(prompt, min(prompt.input_ids.shape[0] - 1, self.max_tokens))
        return PromptBlocks(block_keys(prompt, self.model, ends), ends)

    def lookup(self, prompt: Prompt, blocks: PromptBlocks) -> PrefixHit | None:
        """The longest run of cached blocks from the start (`blocks` from `self.blocks`), cut
        back so that no segment straddles its end."""
        keys = blocks.keys
        held = self.cache.store.contains_many(keys) if keys else []
        count = next((i for i, h in enumerate(held) if not h), len(held))
        count = blocks.count_within(covered(prompt, blocks.length(count)))
        if count == 0:
            return None
        entries = self.cache.store.get_many(keys[:count])
        good = next((j for j, e in enumerate(entries) if not self._fits(e, blocks, j)), count)
        good = blocks.count_within(covered(prompt, blocks.length(good)))
        if good == 0:
            return None
        k = torch.cat([e.keys for e in entries[:good]], dim=1)  # [L, P, kvh, d]
        v = torch.cat([e.values for e in entries[:good]], dim=1)
        return PrefixHit(blocks.length(good), k.to(self.device, self.dtype),
                         v.to(self.device, self.dtype))

    def span_to_store(self, blocks: PromptBlocks, start: int, exact_end: int
                      ) -> tuple[int, int] | None:
        """Rows [start, end) whose blocks this request should store: whole blocks after the
        cached prefix (`start`, a block end or 0), computed exactly (before `exact_end`)."""
        end = blocks.length(blocks.count_within(exact_end))
        return (start, end) if end > start else None

    def entries(self, blocks: PromptBlocks, rows: tuple[int, int],
                kv: tuple[torch.Tensor, torch.Tensor]) -> list[tuple[str, ImageEntry]]:
        """Block entries (host tensors, the store's dtype) from the captured rows' KV
        ([L, end - start, kvh, d] each, rows [start, end) from `span_to_store`)."""
        start, end = rows
        out = []
        for j in range(blocks.count_within(start), blocks.count_within(end)):
            a, b = blocks.length(j) - start, blocks.ends[j] - start
            k, v = (t[:, a:b].to("cpu", self.cache.put_dtype) for t in kv)
            out.append((blocks.keys[j], ImageEntry(keys=k.contiguous(), values=v.contiguous())))
        return out

    def _fits(self, entry: ImageEntry | None, blocks: PromptBlocks, j: int) -> bool:
        if entry is None or not entry.has_kv or entry.embeds is not None:
            return False
        L, rows, kvh, d = entry.keys.shape
        return (L, kvh, d) == self.shape and rows == blocks.ends[j] - blocks.length(j)
