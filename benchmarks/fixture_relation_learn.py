"""Can the fixture's vision tower *learn* where shapes lie relative to each other, and how fast?

`fixture_relation_probe.py` shows whether a trained tower's tokens carry positions; this script
asks whether the architecture can learn them when asked directly: starting from given weights,
the tower and a `RelationHead` (pooled tokens of shape A and of shape B → is B right of A,
below A) are trained on that loss alone, no LM, and the head's accuracy on held-out scenes is
printed along the way. Chance is ~50%. `--full-attention` makes every block attend globally
(Qwen2.5-VL's config allows it; the fixture uses windows with global blocks 2 and 5 only).

    python benchmarks/fixture_relation_learn.py [--vision W] [--steps 200] [--full-attention]

One thread, roughly 1–3 s a step at 112–224 px.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
    Qwen2_5_VisionTransformerPretrainedModel,
)

from vlcache.fixture.assemble import image_processor, vision_config
from vlcache.fixture.batches import vision_batch
from vlcache.fixture.build import VISION_WEIGHTS
from vlcache.fixture.data import Example, make_example
from vlcache.fixture.labels import cell_labels
from vlcache.fixture.probe import RelationHead, relation_loss


def scenes(seed: int, start: int, n: int, sides: tuple[int, int]) -> list[Example]:
    """Relation scenes (two shapes) and count scenes (one to five), for more pairs."""
    kinds = ("relation", "count")
    return [make_example(seed, start + i, sides=sides, qtype=kinds[i % 2]) for i in range(n)]


def run_loss(tower, head, proc, examples: list[Example]):
    vb = vision_batch(proc, examples)
    merged = tower(vb.pixel_values, grid_thw=vb.grid_thw).pooler_output  # [sum N, 896]
    labels = [cell_labels(ex) for ex in examples]
    return relation_loss(head, merged, vb.n_tokens, labels, [ex.shapes for ex in examples])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vision", type=Path, default=VISION_WEIGHTS)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--sides", default="112,224")
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--full-attention", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sides = tuple(int(x) for x in args.sides.split(","))
    cfg = vision_config()
    if args.full_attention:
        cfg.fullatt_block_indexes = list(range(cfg.depth))
    tower = Qwen2_5_VisionTransformerPretrainedModel._from_config(cfg)
    tower.load_state_dict({k: v.float() for k, v in load_file(args.vision).items()})
    head = RelationHead(cfg.out_hidden_size)
    opt = torch.optim.AdamW([*tower.parameters(), *head.parameters()], lr=args.lr)
    proc = image_processor()
    held = scenes(50_000, 0, 64, sides)
    print(f"{args.vision} · full attention {args.full_attention} · lr {args.lr} · "
          f"{args.batch} scenes a step at {sides[0]}–{sides[1]} px")
    t0, seen = time.time(), [0, 0]
    for step in range(1, args.steps + 1):
        tower.train()
        loss, acc, n = run_loss(tower, head, proc, scenes(60_000, step * 64, args.batch, sides))
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen[0] += round(acc * n)
        seen[1] += n
        if step % args.every == 0 or step == args.steps:
            tower.eval()
            with torch.no_grad():
                _, held_acc, held_n = run_loss(tower, head, proc, held)
            print(f"step {step:4d}  train {seen[0] / max(seen[1], 1):.1%}  held-out "
                  f"{held_acc:.1%} ({held_n} pair-axes)  {time.time() - t0:.0f} s", flush=True)
            seen = [0, 0]


if __name__ == "__main__":
    main()
