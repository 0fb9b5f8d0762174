"""Where one request's time goes: caches an image, then runs one request of the peer
benchmark's kinds (miss, same prompt, moved, long text after the image) under torch.profiler,
one thread, and prints its wall time, its stats and the operators by self time.

    .venv/bin/python benchmarks/profile_request.py --case long --tokens 1024
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer.cases import QUESTION, SYSTEM, WORDS  # noqa: E402
from peer.images import noise_image  # noqa: E402

from vlcache.engine import Engine  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path("~/.cache/vlcache/fixture-qwen2_5_vl-0.5b")
                                          .expanduser()))
    p.add_argument("--case", choices=("miss", "same", "moved", "long"), default="long")
    p.add_argument("--tokens", type=int, default=1024, help="image tokens")
    p.add_argument("--long-words", type=int, default=1800)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--packing", default="auto")
    p.add_argument("--policy", default="static:0.05")
    p.add_argument("--rows", type=int, default=15, help="operators shown")
    args = p.parse_args()
    torch.set_num_threads(1)
    engine = Engine.from_pretrained(args.model, store="memory://?max_bytes=4GB",
                                    dtype=getattr(torch, args.dtype), device="cpu",
                                    packing=args.packing)
    image = noise_image(args.tokens, 1)

    def messages(img, system=SYSTEM, before="", after=""):
        parts = [{"type": "text", "text": before}] if before else []
        parts += [{"type": "image", "image": img}, {"type": "text", "text": after + QUESTION}]
        return [{"role": "system", "content": system}, {"role": "user", "content": parts}]

    engine.generate(messages(image), policy=args.policy, max_tokens=1)  # caches the image
    engine.generate(messages(noise_image(args.tokens, 2)), policy=args.policy, max_tokens=1,
                    store_entries=False)  # warm-up
    msgs = {"miss": lambda: messages(noise_image(args.tokens, 3)),
            "same": lambda: messages(image),
            "moved": lambda: messages(image, system="Be brief.", before=QUESTION),
            "long": lambda: messages(image, after=" ".join(
                random.Random(0).choice(WORDS) for _ in range(args.long_words)) + ". "),
            }[args.case]()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        result = engine.generate(msgs, policy=args.policy, max_tokens=1, store_entries=False)
        wall = time.perf_counter() - start
    st = result.stats
    print(f"{args.case}, {args.tokens} image tokens, {args.dtype}, packing {engine.packing}: "
          f"{wall:.2f} s (under the profiler); prompt {st.prompt_tokens} tokens, cached "
          f"{st.cached_tokens}, computed {st.computed_per_layer[0]} rows at layer 0; "
          f"vision {st.vision_s:.2f} s, prefill {st.prefill_s:.2f} s")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
