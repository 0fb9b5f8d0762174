"""A miss (fresh image) end to end with the decoder's big matmuls and MLP run in row chunks of
each given size (models/packing.py `CHUNK_ROWS`; a size above the prompt's length: no
chunking), one engine, the sizes alternated request by request on the same image. One thread;
medians of wall time, vision tower and prefill, and the median per-round ratio to the first
size.

    .venv/bin/python benchmarks/chunk_rows.py --tokens 1024 --rounds 3 --sizes 100000,256,512
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer.images import noise_image  # noqa: E402

from vlcache.engine import Engine  # noqa: E402
from vlcache.models import packing  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path("~/.cache/vlcache/fixture-qwen2_5_vl-0.5b")
                                          .expanduser()))
    p.add_argument("--tokens", type=int, default=1024, help="image tokens")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="100000,256", help="row chunk sizes, the first the reference")
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    torch.set_num_threads(1)
    engine = Engine.from_pretrained(args.model, store="memory://", dtype=torch.float32,
                                    device="cpu")

    def messages(img):
        return [{"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": [{"type": "image", "image": img},
                                             {"type": "text", "text": "Describe it in one word."}]}]

    engine.generate(messages(noise_image(args.tokens, 0)), max_tokens=1, store_entries=False)
    runs: dict[int, list[tuple[float, float, float]]] = {s: [] for s in sizes}
    for r in range(args.rounds):
        image = noise_image(args.tokens, 1 + r)  # a miss every time: entries are not stored
        for size in sizes:
            packing.CHUNK_ROWS = size
            start = time.perf_counter()
            stats = engine.generate(messages(image), max_tokens=1, store_entries=False).stats
            runs[size].append((time.perf_counter() - start, stats.vision_s, stats.prefill_s))
            print(f"round {r} chunk {size}: {runs[size][-1][0]:.2f} s (vision "
                  f"{stats.vision_s:.2f}, prefill {stats.prefill_s:.2f})", flush=True)
    ref = sizes[0]
    print(f"\n{args.model}, {args.tokens} image tokens, {args.rounds} rounds, one thread\n")
    print(f"| chunk rows | wall s | vision s | prefill s | wall ÷ chunk {ref}'s |")
    print("|---:|---:|---:|---:|---:|")
    for size in sizes:
        med = [statistics.median(run[i] for run in runs[size]) for i in range(3)]
        ratio = statistics.median(a[0] / b[0] for a, b in zip(runs[size], runs[ref], strict=True))
        print(f"| {size} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f} | {ratio:.3f} |")


if __name__ == "__main__":
    main()
