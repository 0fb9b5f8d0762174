"""Do the vision tower's tokens say where things are? A probe for the fixture's relation questions.

Relation questions ("Is the red circle to the left of the blue square?") need, in the LM's image
slots, some trace of where each shape lies: the frozen LM reads *content*, and the tower has only
relative (rotary) positions. This script freezes a tower, encodes relation scenes (two shapes),
pools each shape's merged tokens, and fits small probes on one set of scenes, scored on another:

- `pair`: an MLP on (pooled A, pooled B), each reduced to its top 32 principal components →
  is B right of A / below A (the clear axes only); chance is ~50%. This is what the LM would
  have to read.
- `pair + coordinates` (control): the same MLP also given both shapes' true centres; it must
  reach ~100%, or the probe itself is too weak to conclude anything.
- `x` / `y`: a linear fit of a shape's centre (fraction of the width / height) from its pooled
  tokens, as R² on the held-out scenes (0 = no absolute position in the tokens).

    python benchmarks/fixture_relation_probe.py [--vision W.safetensors] [-n 240] [--threads 1]

No LM is loaded; one thread, a few minutes (encoding dominates).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from vlcache.fixture.assemble import image_processor, load_tower
from vlcache.fixture.batches import vision_batch
from vlcache.fixture.build import VISION_WEIGHTS
from vlcache.fixture.labels import cell_labels
from vlcache.workloads.synthetic import Example, make_example


def scenes(seed: int, n: int, sides: tuple[int, int]) -> list[Example]:
    return [make_example(seed, i, sides=sides, qtype="relation") for i in range(n)]


@torch.no_grad()
def pooled(tower, examples: list[Example], batch: int = 16):
    """Per shape: its pooled merged tokens [D], its centre as fractions of width and height."""
    feats, centres, scene_of = [], [], []
    proc = image_processor()
    for start in range(0, len(examples), batch):
        chunk = examples[start : start + batch]
        vb = vision_batch(proc, chunk)
        merged = tower(vb.pixel_values, grid_thw=vb.grid_thw).pooler_output  # [sum N, D]
        for k, (tokens, ex) in enumerate(zip(torch.split(merged, vb.n_tokens), chunk, strict=True)):
            lab = cell_labels(ex)
            w, h = ex.image.size
            for i, s in enumerate(ex.shapes):
                mask = lab.shape == i + 1
                if mask.any():
                    feats.append(tokens[mask].mean(0))
                    centres.append(torch.tensor([s.cx / w, s.cy / h, s.r / w, s.r / h]))
                    scene_of.append(start + k)
    return torch.stack(feats), torch.stack(centres), torch.tensor(scene_of)


def pairs(centres: torch.Tensor, scene_of: torch.Tensor):
    """Ordered pairs of shapes in one scene with their targets (-100 where the axis overlaps)."""
    a_idx, b_idx, tx, ty = [], [], [], []
    for s in scene_of.unique().tolist():
        members = (scene_of == s).nonzero().flatten().tolist()
        for i in members:
            for j in members:
                if i == j:
                    continue
                (ax, ay, arx, ary), (bx, by, brx, bry) = centres[i], centres[j]
                dx, dy = bx - ax, by - ay
                x = 1 if dx > arx + brx else 0 if dx < -(arx + brx) else -100
                y = 1 if dy > ary + bry else 0 if dy < -(ary + bry) else -100
                if x >= 0 or y >= 0:
                    a_idx.append(i), b_idx.append(j), tx.append(x), ty.append(y)
    return torch.tensor(a_idx), torch.tensor(b_idx), torch.tensor(tx), torch.tensor(ty)


def reduce(train: torch.Tensor, test: torch.Tensor, k: int = 32):
    """Both sets projected on the training set's top-k principal components (a probe on 896
    dimensions per shape would overfit a few hundred pairs)."""
    mu = train.mean(0)
    _, _, v = torch.linalg.svd(train - mu, full_matrices=False)
    return (train - mu) @ v[:k].T, (test - mu) @ v[:k].T


def fit_pairs(train_x, train_t, test_x, test_t, epochs: int = 400) -> float:
    """A 2-layer MLP on pair inputs → 2 binary targets; accuracy on the test pairs' clear axes."""
    torch.manual_seed(0)
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    net = nn.Sequential(nn.Linear(train_x.shape[1], 128), nn.GELU(), nn.Linear(128, 4))
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=1e-2)
    for _ in range(epochs):
        out = net((train_x - mu) / sd).view(-1, 2, 2)  # [P, axis, class]
        loss = F.cross_entropy(out.reshape(-1, 2), train_t.reshape(-1), ignore_index=-100)
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        pred = net((test_x - mu) / sd).view(-1, 2, 2).argmax(-1)
    keep = test_t >= 0
    return (pred[keep] == test_t[keep]).float().mean().item()


def r2(train_x, train_y, test_x, test_y) -> float:
    """R² on the test set of a ridge fit on the training set (features standardised)."""
    mu, sd = train_x.mean(0), train_x.std(0) + 1e-6
    a, b = (train_x - mu) / sd, (test_x - mu) / sd
    a1 = torch.cat([a, torch.ones(len(a), 1)], 1)
    b1 = torch.cat([b, torch.ones(len(b), 1)], 1)
    ridge = 10.0 * torch.eye(a1.shape[1])
    w = torch.linalg.solve(a1.T @ a1 + ridge, a1.T @ train_y)
    resid = ((b1 @ w - test_y) ** 2).sum()
    return (1 - resid / ((test_y - test_y.mean()) ** 2).sum()).item()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vision", type=Path, default=VISION_WEIGHTS)
    ap.add_argument("-n", type=int, default=240, help="scenes per split")
    ap.add_argument("--sides", default="224,448", help="image side range in pixels")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sides = tuple(int(x) for x in args.sides.split(","))
    tower = load_tower(args.vision)
    tower.eval()
    t0 = time.time()
    train = pooled(tower, scenes(30_000, args.n, sides))
    test = pooled(tower, scenes(40_000, args.n, sides))
    print(f"{args.vision} · {args.n} + {args.n} relation scenes at {sides[0]}–{sides[1]} px · "
          f"encoded in {time.time() - t0:.0f} s")
    (fa, ca, sa), (fb, cb, sb) = train, test
    fa, fb = reduce(fa, fb)
    ia, ja, xa, ya = pairs(ca, sa)
    ib, jb, xb, yb = pairs(cb, sb)
    ta, tb = torch.stack([xa, ya], 1), torch.stack([xb, yb], 1)
    clear = int((tb >= 0).sum())
    acc = fit_pairs(torch.cat([fa[ia], fa[ja]], 1), ta, torch.cat([fb[ib], fb[jb]], 1), tb)
    ctl = fit_pairs(torch.cat([fa[ia], fa[ja], ca[ia, :2], ca[ja, :2]], 1), ta,
                    torch.cat([fb[ib], fb[jb], cb[ib, :2], cb[jb, :2]], 1), tb)
    share_right = (tb[tb >= 0] == 1).float().mean().item()
    majority = max(share_right, 1 - share_right)
    print(f"pair (B right of / below A) from pooled tokens: {acc:.1%} over {clear} test pair-axes "
          f"(majority class {majority:.1%})")
    print(f"pair + true centres (control):                  {ctl:.1%}")
    print(f"x centre from pooled tokens, R²: {r2(fa, ca[:, 0], fb, cb[:, 0]):.2f}")
    print(f"y centre from pooled tokens, R²: {r2(fa, ca[:, 1], fb, cb[:, 1]):.2f}")


if __name__ == "__main__":
    main()
