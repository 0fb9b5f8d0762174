"""End to end, the packings of models/packing.py side by side, one engine each, alternated
request by request: `dual` (MKL-packed weights for one row and for many, oneDNN's between),
`dual-plain` (dual where MKL's packing is missing: plain weights there), `packed` (oneDNN's
only) and `off` (plain only), on a miss, the same prompt again, a moved image and a long text
after the image. One thread; medians and the median per-round ratio to the first
(`dual` unless `--modes` says otherwise).

    .venv/bin/python benchmarks/packing_modes.py --model ~/.cache/vlcache/fixture-qwen2_5_vl-0.5b
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from peer.cases import WORDS  # noqa: E402
from peer.images import noise_image  # noqa: E402

from vlcache.engine import Engine  # noqa: E402
from vlcache.models import packing  # noqa: E402

MODES = ("dual", "dual-plain", "packed", "off")
CASES = ("miss", "same", "moved", "long")


def load(model: str, mode: str) -> Engine:
    """An engine with `mode`'s packing (`dual-plain`: `dual` as where MKL cannot pack)."""
    engine = Engine.from_pretrained(model, store="memory://?max_bytes=4GB", dtype=torch.float32,
                                    device="cpu", packing="off")
    if mode != "off":
        mkl = packing.can_pack_mkl
        if mode == "dual-plain":
            packing.can_pack_mkl = lambda dtype: False
        try:
            packing.pack_decoder_layers(engine.adapter.layers, dual=mode != "packed")
        finally:
            packing.can_pack_mkl = mkl
        engine.packing = engine.adapter.packing = "packed" if mode == "packed" else "dual"
    return engine


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path("~/.cache/vlcache/fixture-qwen2_5_vl-0.5b")
                                          .expanduser()))
    p.add_argument("--tokens", type=int, default=1024, help="image tokens")
    p.add_argument("--long-words", type=int, default=1800, help="words of text (long case)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policy", default="static:0.05")
    p.add_argument("--modes", default=",".join(MODES),
                   help=f"packings to compare, the first the reference ({', '.join(MODES)})")
    args = p.parse_args()
    modes = args.modes.split(",")
    if unknown := set(modes) - set(MODES):
        p.error(f"--modes: unknown {', '.join(sorted(unknown))}")
    torch.set_num_threads(1)
    engines = {mode: load(args.model, mode) for mode in modes}
    image = noise_image(args.tokens, 1)
    rng = random.Random(0)

    def messages(img, system="You are a helpful assistant.", before="", after=""):
        parts = [{"type": "text", "text": before}] if before else []
        parts += [{"type": "image", "image": img},
                  {"type": "text", "text": after + "Describe this picture in one word."}]
        return [{"role": "system", "content": system}, {"role": "user", "content": parts}]

    for engine in engines.values():
        engine.generate(messages(image), policy=args.policy, max_tokens=1)  # caches the image
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        text = " ".join(rng.choice(WORDS) for _ in range(args.long_words))  # one per round
        for mode, engine in engines.items():
            for case in CASES:
                if case == "miss":  # a fresh image per round, the same for every mode
                    msgs = messages(noise_image(args.tokens, 1000 + r))
                elif case == "same":
                    msgs = messages(image)
                elif case == "moved":
                    msgs = messages(image, system=f"Round {r}, {mode}: be brief.",
                                    before="Describe this picture in one word.")
                else:
                    msgs = messages(image, after=text + ". ")
                start = time.perf_counter()
                engine.generate(msgs, policy=args.policy, max_tokens=1, store_entries=False)
                times.setdefault((case, mode), []).append(time.perf_counter() - start)
            print(f"round {r} {mode}: " + ", ".join(
                f"{c} {times[(c, mode)][-1]:.2f} s" for c in CASES), flush=True)
    print(f"\n{args.model}, {args.tokens} image tokens, {args.rounds} rounds, one thread; "
          f"dual: outer rows 1 and >= {packing.MKL_ROWS} (MKL), 1 and >= {packing.PLAIN_ROWS} "
          f"(plain)\n")
    ref = modes[0]
    print("| case | " + " | ".join(f"{m} s" for m in modes) + " | "
          + " | ".join(f"{m} ÷ {ref}" for m in modes[1:]) + " |")
    print("|---|" + "---:|" * (2 * len(modes) - 1))
    for case in CASES:
        med = {m: statistics.median(times[(case, m)]) for m in modes}
        ratio = {m: statistics.median(a / b for a, b in zip(times[(case, m)],
                                                            times[(case, ref)], strict=True))
                 for m in modes}
        print(f"| {case} | " + " | ".join(f"{med[m]:.2f}" for m in modes) + " | "
              + " | ".join(f"{ratio[m]:.2f}×" for m in modes[1:]) + " |")


if __name__ == "__main__":
    main()
