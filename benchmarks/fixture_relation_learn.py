"""Can the fixture's vision tower *learn* where shapes lie relative to each other, and how fast?

`fixture_relation_probe.py` shows whether a trained tower's tokens carry positions; this script
asks whether the architecture can learn them when asked directly: starting from given weights,
the tower and a `RelationHead` (pooled tokens of shape A and of shape B → is B right of A,
below A) are trained on that loss alone, no LM, and the head's accuracy on held-out scenes is
printed along the way. Chance is ~50%. `--full-attention` makes every block attend globally
(Qwen2.5-VL's config allows it; the fixture uses windows with global blocks 2 and 5 only).
The training itself is `vlcache fixture positions` (which also writes the tower); this script
only measures.

    python benchmarks/fixture_relation_learn.py [--vision W] [--steps 200] [--full-attention]

Roughly 1-3 s a step on one thread at 112-224 px.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from vlcache.fixture.build import VISION_WEIGHTS
from vlcache.fixture.positions import PositionConfig, learn_positions


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vision", type=Path, default=VISION_WEIGHTS)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--sides", default="112,224")
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--full-attention", action="store_true")
    ap.add_argument("--keep-weight", type=float, default=0.0,
                    help="hold the tokens near the starting tower's (0: relation loss alone)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lo, hi = (int(x) for x in args.sides.split(","))
    cfg = PositionConfig(steps=args.steps, batch=args.batch, lr=args.lr, sides=(lo, hi),
                         every=args.every, full_attention=args.full_attention,
                         keep_weight=args.keep_weight)
    learn_positions(args.vision, cfg, log=lambda line: print(line, flush=True))


if __name__ == "__main__":
    main()
