"""The engine: requests in, answers out, images reused from the store wherever they appear."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vlcache.engine.blocks import BlockCache, PrefixHit, PromptBlocks, after
from vlcache.engine.cache import SegmentCache
from vlcache.engine.generation import (
    TextStream,
    continue_tokens,
    greedy_tokens,
    stop_token_ids,
    turn_token_ids,
)
from vlcache.engine.request import Limits, Messages, PreparedSegment, Prompt, PromptBuilder
from vlcache.engine.sampling import SamplingParams, sample
from vlcache.engine.segments import (
    account,
    embed_prompt,
    encode_images,
    segment_inputs,
    stored_contexts,
)
from vlcache.engine.stats import RequestStats
from vlcache.entry import ImageEntry
from vlcache.keys import ModelFingerprint
from vlcache.models.adapter import DecoderAdapter
from vlcache.plan import Plan
from vlcache.reuse.decode import decode_step, forced_logits
from vlcache.reuse.guard import GuardPolicy
from vlcache.reuse.kvcache import KVCache
from vlcache.reuse.policy import Policy
from vlcache.reuse.prefill import PrefillOutput, SegmentInput, selective_prefill
from vlcache.reuse.prefix import context_digest
from vlcache.reuse.ranking import RankedSchedule
from vlcache.reuse.registry import parse_policy
from vlcache.reuse.relevance import question_rows
from vlcache.reuse.sensitivity import ProbeInputs, sensitivity
from vlcache.stores.address import open_store
from vlcache.stores.base import Store

log = logging.getLogger("vlcache.engine")

DEFAULT_POLICY = "static:0.05"


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "cancelled"
    stats: RequestStats


@dataclass
class StreamDelta:
    text: str
    result: GenerationResult | None = None  # set on the last delta only


@dataclass(frozen=True)
class ModelShape:
    """What a report says about the model's size."""

    architecture: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int


@dataclass
class PrefillRun:
    """A prepared and prefilled request (what decoding, evaluation and profiling start from)."""

    prompt: Prompt
    positions: torch.Tensor  # [3, S]
    output: PrefillOutput
    stats: RequestStats
    pending: list[tuple[str, ImageEntry]] = field(default_factory=list)  # entries to store


class Engine:
    """Serves one model; reuses cached segment entries (images, documents) under a policy.

    The engine is the one way into the layer loop: evaluation, planning and benchmarks use the
    public methods below. `adapter`, `builder` and `cache` are its parts, read by its tests.
    """

    def __init__(self, adapter: DecoderAdapter, tokenizer, image_processor,
                 store: Store | str | None = None, policy: Policy | Plan | str = DEFAULT_POLICY,
                 kv_dtype: torch.dtype | None = None, limits: Limits | None = None,
                 capture_hidden_at: int | None = None, exact_hits: bool = True,
                 packing: str = "auto") -> None:
        # oneDNN-packed decoder weights (models/packing.py): auto, dual, packed or off
        self.packing = adapter.pack_weights(packing)
        self.adapter = adapter
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.policy = parse_policy(policy)
        # New entries also keep their hidden state entering this layer, for plans that resume
        # there (Plan.start_layer); by default the layer the engine's own plan starts at.
        start = getattr(getattr(self.policy, "plan", None), "start_layer", 0)
        self.cache = SegmentCache(open_store(store, model=adapter.fingerprint), adapter,
                                  kv_dtype, None)
        self.capture_hidden_at = capture_hidden_at if capture_hidden_at is not None else (
            start or None)
        self.limits = limits or Limits()
        self.builder = PromptBuilder(tokenizer, image_processor, adapter.fingerprint,
                                     self.cache.kv_dtype, adapter.image_token_id,
                                     getattr(adapter, "tokens_for_grid", None), self.limits)
        # Behind an identical prefix a cached segment is exact and nothing is recomputed,
        # whatever the policy; False (analysis only) lets the policy's schedule apply there too,
        # and turns the block prefix cache off.
        self.exact_hits = exact_hits
        a = adapter
        self.blocks = BlockCache(self.cache, str(a.fingerprint), a.num_layers, a.kv_heads,
                                 a.head_dim, a.device, a.dtype) if exact_hits else None
        self.stop_ids = stop_token_ids(tokenizer, adapter.model)
        self.turn_ids = turn_token_ids(tokenizer)

    @classmethod
    def from_pretrained(cls, path: str | Path, store: Store | str | None = None,
                        policy: Policy | Plan | str = DEFAULT_POLICY,
                        dtype: torch.dtype | None = None, device: str | None = None,
                        **kwargs: Any) -> Engine:
        """An engine over a local checkpoint directory or .gguf file. `device`: "cpu", "cuda"
        or "cuda:N" (default: cuda when available, else cpu); `dtype` defaults to bfloat16 on
        CUDA and float32 on the CPU; `packing` (in kwargs) as for the constructor."""
        from vlcache.models.loading import default_device, default_dtype, load_checkpoint

        device = device or default_device()
        adapter, tokenizer, processor = load_checkpoint(
            path, dtype=dtype or default_dtype(device), device=device)
        return cls(adapter, tokenizer, processor, store=store, policy=policy, **kwargs)

    # --- what the model is --------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The store this engine reads and writes (shared with the server's metrics)."""
        return self.cache.store

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.cache.kv_dtype

    @property
    def capture_hidden_at(self) -> int | None:
        """The layer whose input new entries also keep (for plans that resume there)."""
        return self.cache.capture_hidden_at

    @capture_hidden_at.setter
    def capture_hidden_at(self, layer: int | None) -> None:
        if layer is not None and not 0 < layer < self.num_layers:
            raise ValueError(f"capture_hidden_at={layer} is not one of the model's layers "
                             f"1..{self.num_layers - 1}")
        self.cache.capture_hidden_at = layer

    @property
    def num_layers(self) -> int:
        return self.adapter.num_layers

    @property
    def fingerprint(self) -> ModelFingerprint:
        return self.adapter.fingerprint

    @property
    def dtype(self) -> torch.dtype:
        return self.adapter.dtype

    @property
    def device(self) -> torch.device:
        return self.adapter.device

    @property
    def image_token_id(self) -> int | None:
        return self.adapter.image_token_id

    @property
    def shape(self) -> ModelShape:
        a = self.adapter
        return ModelShape(a.architecture, a.num_layers, a.hidden_size, a.num_heads, a.kv_heads,
                          a.head_dim)

    @property
    def model(self) -> torch.nn.Module:
        """The transformers model this engine runs (for baselines that call it directly)."""
        return self.adapter.model

    # --- public API ---------------------------------------------------------------------------

    def generate(self, messages: Messages, policy: Policy | Plan | str | None = None,
                 store_entries: bool = True, **sampling: Any) -> GenerationResult:
        """Answer a chat request (or complete a raw prompt string); `sampling` takes
        SamplingParams fields (max_tokens, ...). `store_entries=False` leaves the store as it
        was (benchmarks repeating one prompt)."""
        for delta in self.stream(messages, policy=policy, store_entries=store_entries,
                                 **sampling):
            if delta.result is not None:
                return delta.result
        raise RuntimeError("generation ended without a result")

    def stream(self, messages: Messages, policy: Policy | Plan | str | None = None,
               should_stop: Callable[[], bool] | None = None, store_entries: bool = True,
               **sampling: Any) -> Iterator[StreamDelta]:
        """Like generate, yielding text as it is produced; the last delta carries the result.

        `should_stop` is asked before every decoding step (e.g. "has the client gone?"); when it
        answers True, generation ends with finish_reason "cancelled".
        """
        if "stop" in sampling and isinstance(sampling["stop"], str):
            sampling["stop"] = (sampling["stop"],)
        params = SamplingParams(**{k: tuple(v) if k == "stop" else v
                                   for k, v in sampling.items() if v is not None})
        yield from self._generate(messages, self._policy(policy), params, should_stop,
                                  store_entries)

    def prepare(self, messages: Messages) -> Prompt:
        """The request's token ids and keyed segments, checked (nothing computed or cached)."""
        return self.builder.build(messages)

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
                            capture, reference, store_entries)
        if store_entries:
            self._store(run)
        return run

    def decode_greedy(self, run: PrefillRun, max_tokens: int,
                      reference: list[int] | None = None, after_divergence: int = 4
                      ) -> list[int]:
        """Greedy continuation of a prefilled run (see generation.greedy_tokens)."""
        return greedy_tokens(self.adapter, run.output.cache, run.output.logits,
                             int(run.positions.max()) + 1, self.stop_ids, max_tokens,
                             reference, after_divergence)

    def decode_text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    @property
    def end_tokens(self) -> frozenset[int]:
        """Token ids that end an answer (end of turn, end of text)."""
        return frozenset(self.stop_ids)

    def decode_step(self, cache: KVCache, token: int, position: int) -> torch.Tensor:
        """One decoding step over a run's KV cache (`run.output.cache`): logits [V]."""
        with torch.inference_mode():
            return decode_step(self.adapter, cache, token, position)

    def forced_logits(self, runs: list[PrefillRun], tokens: list[int],
                      position: int) -> torch.Tensor:  # [A, t, V]
        """Teacher forcing: the logits after each of `tokens`, appended to each run's cache
        (the runs' prompts of one length), all runs through each layer together."""
        with torch.inference_mode():
            return forced_logits(self.adapter, [r.output.cache for r in runs], tokens,
                                 position)

    def cached_entry(self, key: str) -> ImageEntry | None:
        """A segment's entry as the store holds it (host tensors), or None."""
        return self.cache.get(key)

    def holds(self, key: str) -> bool:
        """Whether the store holds an entry for this segment key."""
        return self.store.contains(key)

    def sensitivity(self, probe: ProbeInputs, ratios: list[float]) -> torch.Tensor:
        """S_l(r) for one prompt ([L, len(ratios)]; design §3, reuse/sensitivity.py)."""
        return sensitivity(self.adapter, probe, ratios)

    def forget(self, messages: Messages) -> list[PreparedSegment]:
        """Drop the cached entries of this request's segments; returns the segments."""
        segments = self.prepare(messages).segments
        self.cache.forget(s.key for s in segments)
        return segments

    # --- internals ----------------------------------------------------------------------------

    def _policy(self, policy: Policy | Plan | str | None) -> Policy:
        return self.policy if policy is None else parse_policy(policy)

    def _generate(self, messages: Messages, policy: Policy, params: SamplingParams,
                  should_stop: Callable[[], bool] | None, store_entries: bool = True
                  ) -> Generator[StreamDelta, None, None]:
        start = time.perf_counter()
        run = self._prefill(messages, policy, params.max_tokens, False, start, False, None,
                            store_entries)
        stats = run.stats
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None \
            else None
        first = sample(run.output.logits, params, generator)
        stats.ttft_s = time.perf_counter() - start
        if store_entries:
            self._store(run)
        decode_start = time.perf_counter()
        tokens: list[int] = []
        text = TextStream(self.tokenizer, params.stop)
        reason = "length"
        steps = continue_tokens(self.adapter, run.output.cache, first,
                                int(run.positions.max()) + 1,
                                lambda logits: sample(logits, params, generator))
        for token in steps:
            if token in self.stop_ids:
                reason = "stop"
                break
            tokens.append(token)
            if text.update(tokens):
                reason = "stop"
                break
            if len(tokens) >= params.max_tokens:
                break
            if should_stop is not None and should_stop():
                reason = "cancelled"
                break
            delta = text.release()
            if delta:
                yield StreamDelta(delta)
        stats.decode_s = time.perf_counter() - decode_start
        stats.completion_tokens = len(tokens)
        result = GenerationResult(text.text, tokens, reason, stats)
        yield StreamDelta(text.rest(), result)

    def _prefill(self, messages: Messages, policy: Policy, max_new_tokens: int,
                 keep_hidden: bool, start: float, capture: bool,
                 reference: dict[str, tuple[torch.Tensor, torch.Tensor]] | None,
                 store: bool = True) -> PrefillRun:
        t = time.perf_counter()
        prompt = self.builder.build(messages)
        stats = RequestStats(policy=policy.name, prompt_tokens=int(prompt.input_ids.shape[0]),
                             prepare_s=time.perf_counter() - t,
                             images=len(prompt.images),
                             image_tokens=sum(im.num_tokens for im in prompt.images),
                             documents=len(prompt.segments) - len(prompt.images))
        with torch.inference_mode():
            blocks = (self.blocks.blocks(prompt) if self.blocks and policy.reuse_kv
                      else PromptBlocks([], []))
            hit = self._prefix_hit(prompt, blocks, stats)
            view = Prompt(prompt.input_ids, after(prompt, hit.length)) if hit else prompt
            lookup = self.cache.lookup(view, policy, stats)
            encoded = encode_images(self.adapter, view, lookup, stats)
            stats.images_hit += len(prompt.images) - len(view.images)  # inside the prefix
            embeds = embed_prompt(self.adapter, view, encoded)  # [S, H]
            positions = self.adapter.positions(prompt.input_ids, prompt.grid_thw)  # [3, S]
            contexts = [context_digest(prompt.input_ids, seg.start,
                                       [e.key for e in prompt.segments if e.start < seg.start])
                        for seg in view.segments]
            segments = segment_inputs(view, policy, lookup, encoded, contexts, capture,
                                      self.adapter, self.exact_hits)
            for sp, seg in zip(view.segments, segments, strict=True):
                if reference and seg.reused and sp.key in reference:
                    seg.reference_keys, seg.reference_values = reference[sp.key]
            to_store = self._blocks_to_store(blocks, prompt, segments, hit) if store else None
            t = time.perf_counter()
            out = self._run_layers(view, policy, embeds, positions, segments, stats,
                                   embeds.shape[0] + max_new_tokens, keep_hidden, hit, to_store)
            stats.prefill_s = time.perf_counter() - t
        account(stats, view, segments, out)
        run = PrefillRun(prompt, positions, out, stats)
        run.pending = self.cache.new_entries(view, segments, out, encoded, positions,
                                             stored_contexts(view, segments, contexts),
                                             lookup.held)
        if to_store is not None and out.captured_rows is not None:
            run.pending += self.blocks.entries(blocks, to_store, out.captured_rows)
        stats.ttft_s = time.perf_counter() - start
        return run

    def _prefix_hit(self, prompt: Prompt, blocks: PromptBlocks, stats: RequestStats
                    ) -> PrefixHit | None:
        """The cached exact prefix of this prompt (no blocks: the policy reuses no KV)."""
        if not blocks:
            return None
        t = time.perf_counter()
        hit = self.blocks.lookup(prompt, blocks)
        stats.load_s += time.perf_counter() - t
        stats.prefix_tokens_reused = hit.length if hit else 0
        return hit

    def _blocks_to_store(self, blocks: PromptBlocks, prompt: Prompt,
                         segments: list[SegmentInput], hit: PrefixHit | None
                         ) -> tuple[int, int] | None:
        """Rows whose blocks this request stores: computed exactly (before the first segment
        reused approximately), after the cached prefix."""
        if self.blocks is None or not blocks:
            return None
        exact_end = min((s.start for s in segments if s.reused and not s.exact),
                        default=prompt.input_ids.shape[0])
        return self.blocks.span_to_store(blocks, hit.length if hit else 0, exact_end)

    def _run_layers(self, prompt: Prompt, policy: Policy, embeds: torch.Tensor,
                    positions: torch.Tensor, segments: list[SegmentInput], stats: RequestStats,
                    capacity: int, keep_hidden: bool, hit: PrefixHit | None,
                    blocks: tuple[int, int] | None) -> PrefillOutput:
        """The selective prefill behind the cached prefix; under the guard, once more with every
        reused token computed when its signal says the answer may change (the encoder outputs
        stay reused)."""
        prefix = (hit.keys, hit.values) if hit else None
        spans = [(0, hit.length)] if hit else []
        probe = None  # the question's rows: only a query-ranked schedule reads them
        if any(s.reused and s.schedule.relevance_depth for s in segments):
            probe = question_rows(prompt.input_ids,
                                  spans + [(sp.start, sp.num_tokens) for sp in prompt.segments],
                                  self.turn_ids).to(embeds.device)

        def prefill() -> PrefillOutput:
            return selective_prefill(self.adapter, embeds, positions, segments,
                                     capacity=capacity, keep_hidden=keep_hidden,
                                     capture_hidden_at=self.cache.capture_hidden_at,
                                     probe_rows=probe, prefix=prefix, capture_rows=blocks)

        out = prefill()
        stats.select_s = out.relevance_s
        if isinstance(policy, GuardPolicy) and policy.escalate(out.logits, out.naive_logits):
            for seg in segments:
                if seg.reused and not seg.exact:
                    seg.schedule = RankedSchedule([seg.length] * self.adapter.num_layers,
                                                  "first")
            stats.escalated = True
            out = prefill()
        return out

    def _store(self, run: PrefillRun) -> None:
        self.cache.write(run.pending, run.stats)
        run.pending = []
