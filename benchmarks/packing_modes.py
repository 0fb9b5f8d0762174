"""End to end, one engine, the packings of models/packing.py alternated request by request:
`dual` (plain weights for one row and for many, packed ones between), `packed` (packed only)
and `off` (plain only), on a miss, the same prompt again, a moved image and a long text after
the image. One thread; medians and the median per-round ratio to `dual`.

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

MODES = ("dual", "packed", "off")
CASES = ("miss", "same", "moved", "long")


def set_mode(modules: list[packing.PackedLinear], weights: list[torch.Tensor], mode: str,
             plain_rows: int) -> None:
    """Every packed projection as if the engine had been built with `mode`."""
    for mod, weight in zip(modules, weights, strict=True):
        mod.weight = None if mode == "packed" else weight
        mod.plain_rows = 1 if mode == "off" else plain_rows  # off: every input takes the plain


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path("~/.cache/vlcache/fixture-qwen2_5_vl-0.5b")
                                          .expanduser()))
    p.add_argument("--tokens", type=int, default=1024, help="image tokens")
    p.add_argument("--long-words", type=int, default=1800, help="words of text (long case)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--policy", default="static:0.05")
    args = p.parse_args()
    torch.set_num_threads(1)
    engine = Engine.from_pretrained(args.model, store="memory://?max_bytes=4GB",
                                    dtype=torch.float32, device="cpu", packing="dual")
    mods = [m for m in engine.model.modules() if isinstance(m, packing.PackedLinear)]
    weights = [m.weight for m in mods]
    image = noise_image(args.tokens, 1)
    rng = random.Random(0)

    def messages(img, system="You are a helpful assistant.", before="", after=""):
        parts = [{"type": "text", "text": before}] if before else []
        parts += [{"type": "image", "image": img},
                  {"type": "text", "text": after + "Describe this picture in one word."}]
        return [{"role": "system", "content": system}, {"role": "user", "content": parts}]

    engine.generate(messages(image), policy=args.policy, max_tokens=1)  # caches the image
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        text = " ".join(rng.choice(WORDS) for _ in range(args.long_words))  # one per round
        for mode in MODES:
            set_mode(mods, weights, mode, packing.PLAIN_ROWS)
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
          f"plain rows: 1 and >= {packing.PLAIN_ROWS}\n")
    print("| case | " + " | ".join(f"{m} s" for m in MODES) + " | dual vs packed | dual vs off |")
    print("|---|" + "---:|" * (len(MODES) + 2))
    for case in CASES:
        med = {m: statistics.median(times[(case, m)]) for m in MODES}
        ratio = {m: statistics.median(a / b for a, b in zip(times[(case, m)],
                                                            times[(case, "dual")], strict=True))
                 for m in MODES}
        print(f"| {case} | " + " | ".join(f"{med[m]:.2f}" for m in MODES)
              + f" | {ratio['packed']:.2f}× | {ratio['off']:.2f}× |")


if __name__ == "__main__":
    main()
