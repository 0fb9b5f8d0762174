"""A long prompt after a cached image: is the hit ever slower, or bigger, than the miss?

Caches an image once, then times in interleaved rounds the same long prompt (the image, then
many text tokens) as a miss (`full`: vision tower and full prefill) and as a hit (the policy
given, default static:0.05), with each call's peak resident memory. Timing does not depend on
weight values, so the model is random-weight at the fixture's size (Qwen2.5-0.5B, 24 layers).

    .venv/bin/python benchmarks/long_prompt_hit.py --text-tokens 16384 --image-tokens 1024 \
        --layers 4
"""

from __future__ import annotations

import argparse
import statistics

import torch

from vlcache.bench.images import allow_tokens, synth_image, token_unit
from vlcache.bench.models import random_engine
from vlcache.bench.timing import run_rounds
from vlcache.bench.ttft import engine_case
from vlcache.reuse.registry import parse_policy

MB = 1 << 20


def messages(image, text: str, question: str) -> list[dict]:
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": [{"type": "image", "image": image},
                                         {"type": "text", "text": text + "\n" + question}]}]


def long_text(tokenizer, tokens: int) -> str:
    """Plain words, trimmed to `tokens` tokens of this tokenizer."""
    words = " ".join(f"word{i % 997}" for i in range(tokens))
    ids = tokenizer(words, add_special_tokens=False)["input_ids"][:tokens]
    return tokenizer.decode(ids)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", default="fixture-qwen2_5_vl-0.5b")
    p.add_argument("--layers", type=int, default=None,
                   help="run only this many decoder layers (per-layer cost is unchanged)")
    p.add_argument("--image-tokens", type=int, default=1024)
    p.add_argument("--text-tokens", type=int, default=16384)
    p.add_argument("--policy", default="static:0.05")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine, info = random_engine(args.size, layers=args.layers)
    engine.limits = type(engine.limits)(**{**vars(engine.limits),
                                           "max_prompt_tokens": 4 * args.text_tokens})
    engine.builder.limits = engine.limits
    allow_tokens(engine.image_processor, args.image_tokens)
    image = synth_image(args.image_tokens, token_unit(engine.image_processor), seed=1)
    held = engine.store.nbytes
    engine.generate(messages(image, "A short context.", "Describe it."), policy="full",
                    max_tokens=1)
    entry_mb = (engine.store.nbytes - held) / MB
    prompt = messages(image, long_text(engine.tokenizer, args.text_tokens), "Describe it.")
    cases = {"miss (full)": engine_case(engine, prompt, parse_policy("full")),
             f"hit ({args.policy})": engine_case(engine, prompt, parse_policy(args.policy))}
    samples = run_rounds(cases, args.rounds, on_sample=lambda s: print(
        f"  round {s.round} {s.case}: {s.m.ttft_s:.2f} s, +{(s.rss_delta or 0) / MB:.0f} MB",
        flush=True))
    print(f"\n{info.describe()}; {torch.get_num_threads()} threads")
    print(f"prompt: {samples[0].m.prompt_tokens} tokens ({args.image_tokens} image tokens); "
          f"the image's entry: {entry_mb:.0f} MB\n")
    print("| case | TTFT median (s) | min-max (s) | peak RSS added, median (MB) |")
    print("|---|---|---|---|")
    for name in cases:
        mine = [s for s in samples if s.case == name]
        t = [s.m.ttft_s for s in mine]
        mem = [(s.rss_delta or 0) / MB for s in mine]
        print(f"| {name} | {statistics.median(t):.2f} | {min(t):.2f}-{max(t):.2f} | "
              f"{statistics.median(mem):.0f} |")
    hit, miss = (statistics.median(s.m.ttft_s for s in samples if s.case == n) for n in
                 (f"hit ({args.policy})", "miss (full)"))
    print(f"\nhit / miss time: {hit / miss:.2f}")


if __name__ == "__main__":
    main()
