"""One TTFT sweep: for each image size, cache the image in one context, then time every case
(policies, plain transformers, exact prefix reuse of the same prompt) in interleaved rounds."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from vlcache.bench.images import allow_tokens, synth_image, token_unit
from vlcache.bench.reference import transformers_case
from vlcache.bench.timing import Measurement, Sample, run_rounds
from vlcache.engine import Engine
from vlcache.reuse.policy import Policy

TRANSFORMERS = "transformers"
PREFIX_SAME = "prefix-same"  # exact prefix reuse, asked with the very prompt that cached it
QUESTION = "Describe this picture in one word."
SYSTEM = "You are a helpful assistant."


@dataclass
class SizeResult:
    """Everything measured at one image size."""

    image_tokens: int
    prompt_tokens: int  # N + T of the timed (hit) prompt
    entry_bytes: int  # what the store holds for the image (encoder output + KV of all layers)
    samples: list[Sample]


def requests(image) -> tuple[list[dict], list[dict]]:
    """(cache, hit): the same text and image, the image first in one and last in the other,
    so the hit reuses the KV at new positions with the same number of tokens to compute."""
    system = {"role": "system", "content": SYSTEM}
    first = [system, {"role": "user", "content": [{"type": "image", "image": image},
                                                  {"type": "text", "text": QUESTION}]}]
    last = [system, {"role": "user", "content": [{"type": "text", "text": QUESTION},
                                                 {"type": "image", "image": image}]}]
    return first, last


def engine_case(engine: Engine, messages: list[dict], policy: Policy
                ) -> Callable[[], Measurement]:
    def run() -> Measurement:
        start = time.perf_counter()
        # nothing stored: every round times the same situation (no blocks of the last round)
        st = engine.generate(messages, policy=policy, max_tokens=1, store_entries=False).stats
        return Measurement(ttft_s=time.perf_counter() - start, vision_s=st.vision_s,
                           load_s=st.load_s, prefill_s=st.prefill_s,
                           computed_per_layer=list(st.computed_per_layer),
                           prompt_tokens=st.prompt_tokens, image_tokens=st.image_tokens)

    return run


def measure_size(engine: Engine, tokens: int, policies: dict[str, Policy], repeat: int,
                 reference: bool = True, prefix_same: bool = True, seed: int = 0,
                 on_sample: Callable[[Sample], None] | None = None) -> SizeResult:
    """Warm up by caching a fresh image of `tokens` tokens, then run the interleaved rounds."""
    allow_tokens(engine.image_processor, tokens)
    cache, hit = requests(synth_image(tokens, token_unit(engine.image_processor), seed + tokens))
    held = engine.store.usage.bytes
    warm = engine.generate(cache, policy="full", max_tokens=1).stats
    if warm.image_tokens != tokens:
        raise RuntimeError(f"the image became {warm.image_tokens} tokens, not {tokens}")
    entry_bytes = engine.store.usage.bytes - held
    cases = {name: engine_case(engine, hit, policy) for name, policy in policies.items()}
    if reference:
        cases[TRANSFORMERS] = transformers_case(engine, hit)
    if prefix_same:
        cases[PREFIX_SAME] = engine_case(engine, cache, _prefix())
    samples = run_rounds(cases, repeat, on_sample)
    return SizeResult(tokens, warm.prompt_tokens, entry_bytes, samples)


def _prefix() -> Policy:
    from vlcache.reuse.prefix import PrefixPolicy

    return PrefixPolicy()
