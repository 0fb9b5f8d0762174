"""A prompt's segments made ready for the prefill: encoder outputs in place, cached KV and the
policy's schedule for each reused segment, and the request's accounting afterwards."""

from __future__ import annotations

import time

import torch

from vlcache.engine.cache import Lookup
from vlcache.engine.request import PreparedImage, Prompt
from vlcache.engine.stats import RequestStats
from vlcache.models.adapter import DecoderAdapter, EncodedImage
from vlcache.reuse.policy import Policy, UniformPolicy
from vlcache.reuse.prefill import PrefillOutput, SegmentInput
from vlcache.reuse.prefix import context_digest

EXACT = UniformPolicy(0.0, name="exact")  # an identical-prefix hit: nothing to recompute


def encode_images(adapter: DecoderAdapter, prompt: Prompt, lookup: Lookup,
                  stats: RequestStats) -> dict[str, EncodedImage]:
    """Encoder outputs of every image: from its entry, or one vision-tower call for all the
    misses together."""
    encoded = {k: EncodedImage(e.embeds.to(adapter.dtype), e.deepstack)
               for k, e in lookup.entries.items() if e.embeds is not None}
    missing = list({im.key: im for im in prompt.images if im.key not in encoded}.values())
    if missing:
        t = time.perf_counter()
        pixels = torch.cat([im.pixel_values for im in missing])
        grids = torch.stack([im.grid_thw for im in missing])
        for im, enc in zip(missing, adapter.encode_images(pixels, grids), strict=True):
            encoded[im.key] = enc
        stats.vision_s = time.perf_counter() - t
    stats.images_missed = len(missing)  # vision-tower runs: distinct images encoded
    stats.images_hit = len({im.key for im in prompt.images}) - len(missing)
    return encoded


def embed_prompt(adapter: DecoderAdapter, prompt: Prompt,
                 encoded: dict[str, EncodedImage]) -> torch.Tensor:  # [S, H]
    """Token embeddings with each image's encoder output in place of its placeholder tokens."""
    embeds = adapter.embed(prompt.input_ids)  # [S, H]
    for im in prompt.images:
        embeds[im.start:im.start + im.num_tokens] = encoded[im.key].embeds
    return embeds


def segment_inputs(prompt: Prompt, policy: Policy, lookup: Lookup,
                   encoded: dict[str, EncodedImage], contexts: list[torch.Tensor],
                   capture: bool, adapter: DecoderAdapter,
                   exact_hits: bool = True) -> list[SegmentInput]:
    """Per segment: its cached KV and schedule where the policy reuses it, else whether this
    prefill records its KV (a miss the store lacks, or every computed one with `capture`)."""
    segments, captured = [], set(lookup.held)
    for sp, context in zip(prompt.segments, contexts, strict=True):
        enc = encoded.get(sp.key)
        entry = lookup.entries.get(sp.key)
        seg = SegmentInput(sp.start, sp.num_tokens,
                           deepstack=enc.deepstack if enc is not None else None)
        if (entry is not None and entry.has_kv and policy.reuse_kv
                and policy.may_reuse(entry.context, context)):
            seg.cached_keys = entry.keys.to(adapter.dtype)
            seg.cached_values = entry.values.to(adapter.dtype)
            seg.exact = exact_hits and entry.context is not None and torch.equal(
                entry.context.cpu(), context.cpu())
            seg.schedule = (EXACT if seg.exact else policy).schedule(sp.num_tokens,
                                                                     adapter.num_layers)
            restart = seg.schedule.restart_layer
            if restart is not None and entry.resume_layer == restart:
                seg.cached_hidden = entry.hidden.to(adapter.dtype)
            elif restart is not None:  # this entry cannot resume there
                seg.schedule = seg.schedule.fallback()
        elif capture or sp.key not in captured:
            seg.capture = True
            captured.add(sp.key)
        segments.append(seg)
    return segments


def stored_contexts(prompt: Prompt, segments: list[SegmentInput],
                    contexts: list[torch.Tensor]) -> list[torch.Tensor]:
    """The digests new entries are stored under: a segment computed behind an approximately
    reused one gets an inexact digest (see reuse/prefix.py), never an identical-prefix hit."""
    out, exact = [], True
    for i, (sp, seg) in enumerate(zip(prompt.segments, segments, strict=True)):
        out.append(contexts[i] if exact else context_digest(
            prompt.input_ids, sp.start, [e.key for e in prompt.segments[:i]], exact=False))
        exact = exact and (not seg.reused or seg.exact)
    return out


def account(stats: RequestStats, prompt: Prompt, segments: list[SegmentInput],
            out: PrefillOutput) -> None:
    """Reused and recomputed tokens of KV-reused segments, as layer means, by kind."""
    layers = max(len(out.computed_per_layer), 1)
    stats.computed_per_layer = out.computed_per_layer
    computed = iter(out.reused_computed)  # one list per reused segment, in order
    for sp, seg in zip(prompt.segments, segments, strict=True):
        if not seg.reused:
            continue
        stats.segments_exact += seg.exact
        recomputed = sum(next(computed)) / layers
        if isinstance(sp, PreparedImage):
            stats.images_kv_reused += 1
            stats.image_tokens_recomputed += recomputed
            stats.image_tokens_reused += seg.length - recomputed
        else:
            stats.documents_reused += 1
            stats.text_tokens_reused += seg.length - recomputed
