"""The engine: requests in, answers out, images reused from the store wherever they appear."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vlcache.engine.request import Limits, Messages, PreparedImage, Prompt, PromptBuilder
from vlcache.engine.sampling import SamplingParams, sample
from vlcache.engine.stats import RequestStats
from vlcache.entry import ImageEntry
from vlcache.models.adapter import EncodedImage, QwenVLAdapter
from vlcache.plan import Plan
from vlcache.reuse.decode import decode_step
from vlcache.reuse.guard import GuardPolicy
from vlcache.reuse.policy import Policy
from vlcache.reuse.prefill import PrefillOutput, SegmentInput, selective_prefill
from vlcache.reuse.prefix import context_digest
from vlcache.reuse.ranking import RankedSchedule
from vlcache.reuse.registry import parse_policy
from vlcache.reuse.relevance import question_rows
from vlcache.stores.address import open_store
from vlcache.stores.base import Store

log = logging.getLogger("vlcache.engine")

DEFAULT_POLICY = "static:0.05"


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    stats: RequestStats


@dataclass
class StreamDelta:
    text: str
    result: GenerationResult | None = None  # set on the last delta only


@dataclass
class PrefillRun:
    """A prepared and prefilled request (what decoding, evaluation and profiling start from)."""

    prompt: Prompt
    positions: torch.Tensor  # [3, S]
    output: PrefillOutput
    stats: RequestStats
    pending: list[tuple[str, ImageEntry]] = field(default_factory=list)  # entries to store


class Engine:
    """Serves one Qwen-VL model; reuses cached image entries under a reuse policy."""

    def __init__(self, adapter: QwenVLAdapter, tokenizer, image_processor,
                 store: Store | str | None = None, policy: Policy | Plan | str = DEFAULT_POLICY,
                 kv_dtype: torch.dtype | None = None, limits: Limits | None = None,
                 capture_hidden_at: int | None = None) -> None:
        self.adapter = adapter
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.store = open_store(store, model=adapter.fingerprint)
        self.policy = parse_policy(policy)
        # New entries also keep their hidden state entering this layer, for plans that resume
        # there (Plan.start_layer); by default the layer the engine's own plan starts at.
        start = getattr(getattr(self.policy, "plan", None), "start_layer", 0)
        self.capture_hidden_at = capture_hidden_at if capture_hidden_at is not None else (
            start or None)
        if self.capture_hidden_at is not None and not (
                0 < self.capture_hidden_at < adapter.num_layers):
            raise ValueError(f"capture_hidden_at={self.capture_hidden_at} is not one of the "
                             f"model's layers 1..{adapter.num_layers - 1}")
        # Keys name the dtype the store really holds, so engines sharing a store agree. A store
        # with its own kv_dtype converts (and for fp8 scales) on put; otherwise we cast here.
        self.kv_dtype = self.store.kv_dtype or kv_dtype or adapter.dtype
        self._put_dtype = adapter.dtype if self.store.kv_dtype else self.kv_dtype
        self.limits = limits or Limits()
        self.builder = PromptBuilder(tokenizer, image_processor, adapter.fingerprint,
                                     self.kv_dtype, adapter.image_token_id,
                                     getattr(adapter, "tokens_for_grid", None), self.limits)
        self.stop_ids = _stop_token_ids(tokenizer, adapter.model)
        self.turn_ids = _turn_token_ids(tokenizer)

    @classmethod
    def from_pretrained(cls, path: str | Path, store: Store | str | None = None,
                        policy: Policy | Plan | str = DEFAULT_POLICY,
                        dtype: torch.dtype = torch.float32, **kwargs: Any) -> Engine:
        from vlcache.models.loading import load_checkpoint

        adapter, tokenizer, processor = load_checkpoint(path, dtype=dtype)
        return cls(adapter, tokenizer, processor, store=store, policy=policy, **kwargs)

    # --- public API ---------------------------------------------------------------------------

    def generate(self, messages: Messages, policy: Policy | Plan | str | None = None,
                 **sampling: Any) -> GenerationResult:
        """Answer a chat request (or complete a raw prompt string); `sampling` takes
        SamplingParams fields (max_tokens, ...)."""
        for delta in self.stream(messages, policy=policy, **sampling):
            if delta.result is not None:
                return delta.result
        raise RuntimeError("generation ended without a result")

    def stream(self, messages: Messages, policy: Policy | Plan | str | None = None,
               should_stop: Callable[[], bool] | None = None,
               **sampling: Any) -> Iterator[StreamDelta]:
        """Like generate, yielding text as it is produced; the last delta carries the result.

        `should_stop` is asked before every decoding step (e.g. "has the client gone?"); when it
        answers True, generation ends with finish_reason "cancelled".
        """
        if "stop" in sampling and isinstance(sampling["stop"], str):
            sampling["stop"] = (sampling["stop"],)
        params = SamplingParams(**{k: tuple(v) if k == "stop" else v
                                   for k, v in sampling.items() if v is not None})
        yield from self._generate(messages, self._policy(policy), params, should_stop)

    def prefill(self, messages: Messages, policy: Policy | Plan | str | None = None,
                max_new_tokens: int = 1, keep_hidden: bool = False,
                store_entries: bool = True, capture: bool = False,
                reference: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
                ) -> PrefillRun:
        """Prepare and prefill a request (no decoding): the first-token logits and the stats.

        `capture=True` records in `output.captured` the pre-RoPE KV, in this context, of every
        image the run computes in full, also of images the store already holds (the profiler
        needs the exact KV of the evaluated context); only images the store lacks are stored.
        `reference` (analysis only: the oracle rule) maps segment keys to their exact pre-RoPE
        KV in this prompt, from a captured full run.
        """
        start = time.perf_counter()
        run = self._prefill(messages, self._policy(policy), max_new_tokens, keep_hidden, start,
                            capture, reference)
        if store_entries:
            self._store(run)
        return run

    # --- internals ----------------------------------------------------------------------------

    def _policy(self, policy: Policy | Plan | str | None) -> Policy:
        return self.policy if policy is None else parse_policy(policy)

    def _generate(self, messages: Messages, policy: Policy, params: SamplingParams,
                  should_stop: Callable[[], bool] | None) -> Generator[StreamDelta, None, None]:
        start = time.perf_counter()
        run = self._prefill(messages, policy, params.max_tokens, False, start, False, None)
        stats = run.stats
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None \
            else None
        token = sample(run.output.logits, params, generator)
        stats.ttft_s = time.perf_counter() - start
        self._store(run)
        decode_start = time.perf_counter()
        tokens: list[int] = []
        position = int(run.positions.max()) + 1
        text, emitted, reason = "", 0, "length"
        holdback = max((len(s) - 1 for s in params.stop if s), default=0)  # "" never matches
        while True:
            if token in self.stop_ids:
                reason = "stop"
                break
            tokens.append(token)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            cut = _find_stop(text, params.stop)
            if cut is not None:
                text, reason = text[:cut], "stop"
                break
            if len(tokens) >= params.max_tokens:
                break
            if should_stop is not None and should_stop():
                reason = "cancelled"
                break
            safe = len(text) - holdback if not text.endswith("\ufffd") else emitted
            if safe > emitted:
                yield StreamDelta(text[emitted:safe])
                emitted = safe
            with torch.inference_mode():
                logits = decode_step(self.adapter, run.output.cache, token, position)
            position += 1
            token = sample(logits, params, generator)
        stats.decode_s = time.perf_counter() - decode_start
        stats.completion_tokens = len(tokens)
        result = GenerationResult(text, tokens, reason, stats)
        yield StreamDelta(text[emitted:], result)

    def _prefill(self, messages: Messages, policy: Policy, max_new_tokens: int,
                 keep_hidden: bool, start: float, capture: bool,
                 reference: dict[str, tuple[torch.Tensor, torch.Tensor]] | None
                 ) -> PrefillRun:
        t = time.perf_counter()
        prompt = self.builder.build(messages)
        stats = RequestStats(policy=policy.name, prompt_tokens=int(prompt.input_ids.shape[0]),
                             prepare_s=time.perf_counter() - t,
                             images=len(prompt.images),
                             image_tokens=sum(im.num_tokens for im in prompt.images),
                             documents=len(prompt.segments) - len(prompt.images))
        with torch.inference_mode():
            entries, held = self._lookup(prompt, policy, stats)
            encoded = self._encode(prompt, entries, stats)
            embeds = self.adapter.embed(prompt.input_ids)  # [S, H]
            positions = self.adapter.positions(prompt.input_ids, prompt.grid_thw)  # [3, S]
            contexts = [context_digest(prompt.input_ids, seg.start,
                                       [e.key for e in prompt.segments[:i]])
                        for i, seg in enumerate(prompt.segments)]
            segments = self._segments(prompt, policy, encoded, entries, held, embeds, contexts,
                                      capture)
            for sp, seg in zip(prompt.segments, segments, strict=True):
                if reference and seg.reused and sp.key in reference:
                    seg.reference_keys, seg.reference_values = reference[sp.key]
            probe = question_rows(prompt.input_ids,
                                  [(sp.start, sp.num_tokens) for sp in prompt.segments],
                                  self.turn_ids)
            t = time.perf_counter()

            def prefill() -> PrefillOutput:
                return selective_prefill(self.adapter, embeds, positions, segments,
                                         capacity=embeds.shape[0] + max_new_tokens,
                                         keep_hidden=keep_hidden,
                                         capture_hidden_at=self.capture_hidden_at,
                                         probe_rows=probe.to(embeds.device))

            out = prefill()
            stats.select_s = out.relevance_s
            if isinstance(policy, GuardPolicy) and policy.escalate(out.logits, out.naive_logits):
                for seg in segments:  # recompute every reused token (the encoder stays reused)
                    if seg.reused:
                        seg.schedule = RankedSchedule([seg.length] * self.adapter.num_layers,
                                                      "first")
                stats.escalated = True
                out = prefill()
            stats.prefill_s = time.perf_counter() - t
        _account(stats, prompt, segments, out)
        run = PrefillRun(prompt, positions, out, stats)
        run.pending = self._new_entries(prompt, segments, out, encoded, positions, contexts,
                                        held)
        stats.ttft_s = time.perf_counter() - start
        return run

    def _lookup(self, prompt: Prompt, policy: Policy, stats: RequestStats
                ) -> tuple[dict[str, ImageEntry], set[str]]:
        """Read the entries this policy may use; also which keys the store already holds with
        KV (a policy that does not read the cache must not overwrite what others cached)."""
        kinds = {s.key: isinstance(s, PreparedImage) for s in prompt.segments}
        readable = [k for k, image in kinds.items()
                    if (policy.reuse_encoder if image else policy.reuse_kv)]
        entries: dict[str, ImageEntry] = {}
        if readable:
            t = time.perf_counter()
            for key, entry in zip(readable, self.store.get_many(readable), strict=True):
                if entry is not None and self._fits(entry, prompt, key):
                    entries[key] = entry
            stats.load_s = time.perf_counter() - t
        held = {k for k, e in entries.items() if e.has_kv}
        unread = [k for k in kinds if k not in readable]
        if unread:
            held |= {k for k, c in zip(unread, self.store.contains_many(unread), strict=True)
                     if c}
        return entries, held

    def _encode(self, prompt: Prompt, entries: dict[str, ImageEntry], stats: RequestStats
                ) -> dict[str, EncodedImage]:
        """Encoder outputs of every image: from its entry, or one vision-tower call for all
        the misses together."""
        encoded = {k: EncodedImage(e.embeds.to(self.adapter.dtype), e.deepstack)
                   for k, e in entries.items() if e.embeds is not None}
        missing = list({im.key: im for im in prompt.images if im.key not in encoded}.values())
        if missing:
            t = time.perf_counter()
            pixels = torch.cat([im.pixel_values for im in missing])
            grids = torch.stack([im.grid_thw for im in missing])
            for im, enc in zip(missing, self.adapter.encode_images(pixels, grids), strict=True):
                encoded[im.key] = enc
            stats.vision_s = time.perf_counter() - t
        stats.images_missed = len(missing)  # vision-tower runs: distinct images encoded
        stats.images_hit = len({im.key for im in prompt.images}) - len(missing)
        return encoded

    def _fits(self, entry: ImageEntry, prompt: Prompt, key: str) -> bool:
        a = self.adapter
        seg = next(s for s in prompt.segments if s.key == key)
        n = seg.num_tokens
        kv_ok = tuple(entry.keys.shape) == (a.num_layers, n, a.kv_heads, a.head_dim) \
            if entry.has_kv else True
        if isinstance(seg, PreparedImage):
            ok = entry.embeds is not None and tuple(entry.embeds.shape) == (n, a.hidden_size)
            ok = ok and (entry.deepstack is not None or a.architecture != "qwen3_vl")
        else:
            ok = entry.has_kv
        if not (ok and kv_ok):
            log.warning("cache entry %s does not match this model's shapes; treated as a miss",
                        key[:24])
            self.store.delete(key)
        return ok and kv_ok

    def _segments(self, prompt: Prompt, policy: Policy, encoded: dict[str, EncodedImage],
                  entries: dict[str, ImageEntry], held: set[str], embeds: torch.Tensor,
                  contexts: list[torch.Tensor], capture: bool) -> list[SegmentInput]:
        segments, captured = [], set(held)
        for sp, context in zip(prompt.segments, contexts, strict=True):
            enc = encoded.get(sp.key)
            if enc is not None:
                embeds[sp.start:sp.start + sp.num_tokens] = enc.embeds
            entry = entries.get(sp.key)
            seg = SegmentInput(sp.start, sp.num_tokens,
                               deepstack=enc.deepstack if enc is not None else None)
            if (entry is not None and entry.has_kv and policy.reuse_kv
                    and policy.may_reuse(entry.context, context)):
                seg.cached_keys = entry.keys.to(self.adapter.dtype)
                seg.cached_values = entry.values.to(self.adapter.dtype)
                seg.schedule = policy.schedule(sp.num_tokens, self.adapter.num_layers)
                restart = seg.schedule.restart_layer
                if restart is not None and entry.resume_layer == restart:
                    seg.cached_hidden = entry.hidden.to(self.adapter.dtype)
                elif restart is not None:  # this entry cannot resume there
                    seg.schedule = seg.schedule.fallback()
            elif capture or sp.key not in captured:
                seg.capture = True
                captured.add(sp.key)
            segments.append(seg)
        return segments

    def _new_entries(self, prompt: Prompt, segments: list[SegmentInput], out: PrefillOutput,
                     encoded: dict[str, EncodedImage], positions: torch.Tensor,
                     contexts: list[torch.Tensor], held: set[str]
                     ) -> list[tuple[str, ImageEntry]]:
        pending, done = [], set(held)
        for i, (sp, seg) in enumerate(zip(prompt.segments, segments, strict=True)):
            if i not in out.captured or sp.key in done:
                continue
            done.add(sp.key)
            keys, values = out.captured[i]
            enc = encoded.get(sp.key)
            hidden = out.captured_hidden.get(i)
            pending.append((sp.key, ImageEntry(
                embeds=enc.embeds if enc else None, deepstack=enc.deepstack if enc else None,
                keys=keys.to(self._put_dtype), values=values.to(self._put_dtype),
                positions=positions[:, seg.start:seg.start + seg.length].clone(),
                context=contexts[i],
                hidden=None if hidden is None else hidden.to(self._put_dtype),
                hidden_layer=None if hidden is None else torch.tensor(
                    [self.capture_hidden_at], dtype=torch.int64))))
        return pending

    def _store(self, run: PrefillRun) -> None:
        if not run.pending:
            return
        t = time.perf_counter()
        try:
            self.store.put_many(run.pending)
        except Exception:  # a failing store must never fail the request
            log.exception("storing %d cache entries failed", len(run.pending))
        run.stats.store_s = time.perf_counter() - t
        run.pending = []


def _account(stats: RequestStats, prompt: Prompt, segments: list[SegmentInput],
             out: PrefillOutput) -> None:
    """Reused and recomputed tokens of KV-reused segments, as layer means, by kind."""
    layers = max(len(out.computed_per_layer), 1)
    stats.computed_per_layer = out.computed_per_layer
    computed = iter(out.reused_computed)  # one list per reused segment, in order
    for sp, seg in zip(prompt.segments, segments, strict=True):
        if not seg.reused:
            continue
        recomputed = sum(next(computed)) / layers
        if isinstance(sp, PreparedImage):
            stats.images_kv_reused += 1
            stats.image_tokens_recomputed += recomputed
            stats.image_tokens_reused += seg.length - recomputed
        else:
            stats.documents_reused += 1
            stats.text_tokens_reused += seg.length - recomputed


def _find_stop(text: str, stops: tuple[str, ...]) -> int | None:
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def _turn_token_ids(tokenizer) -> set[int]:
    """Tokens that open a chat turn (ChatML's <|im_start|>, Llama 3's header), where known."""
    ids = set()
    for tok in ("<|im_start|>", "<|start_header_id|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return ids


def _stop_token_ids(tokenizer, model) -> set[int]:
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    ids.update(eos if isinstance(eos, list) else [eos])
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return {i for i in ids if i is not None}
