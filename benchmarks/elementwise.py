"""The decoder's element-wise steps, transformers' way against vlcache's, one thread, side by side:
RMSNorm (models/rms_norm.py) and the rotary embedding (reuse/rope.py) over a prompt's rows.
Each pair is timed alternately, and the ratio is taken within each repeat.

    .venv/bin/python benchmarks/elementwise.py --rows 284,2061,4124
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm, rotate_half

from vlcache.models.rms_norm import ChunkedRMSNorm
from vlcache.reuse.rope import apply_rope


def timed(f: Callable[[], object], inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        f()
    return (time.perf_counter() - start) / inner


def pair(name: str, theirs: Callable[[], object], ours: Callable[[], object], repeat: int,
         inner: int) -> None:
    theirs(), ours()  # warm
    t_theirs, t_ours = [], []
    for _ in range(repeat):
        t_theirs.append(timed(theirs, inner))
        t_ours.append(timed(ours, inner))
    ratios = [a / b for a, b in zip(t_theirs, t_ours, strict=True)]
    print(f"| {name} | {statistics.median(t_theirs) * 1e3:.2f} | "
          f"{statistics.median(t_ours) * 1e3:.2f} | {statistics.median(ratios):.2f}x | "
          f"{min(ratios):.2f}-{max(ratios):.2f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="284,2061,4124")
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--heads", type=int, default=14)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--inner", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    print("| step, rows | transformers ms | vlcache ms | speed-up (median) | min-max |")
    print("|---|---:|---:|---:|---:|")
    with torch.inference_mode():
        norm = Qwen2RMSNorm(args.hidden)
        chunked = ChunkedRMSNorm(norm)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, args.hidden)
            pair(f"RMSNorm, {rows}", lambda x=x: norm(x), lambda x=x: chunked(x), args.repeat,
                 args.inner)
            q = torch.randn(rows, args.heads, args.head_dim)
            angles = torch.rand(rows, args.head_dim // 2) * 100
            emb = torch.cat([angles, angles], -1)
            cos, sin = emb.cos(), emb.sin()
            c, s = cos[:, None], sin[:, None]  # transformers' formula, for queries only
            pair(f"RoPE on queries, {rows}", lambda q=q, c=c, s=s: q * c + rotate_half(q) * s,
                 lambda q=q, cos=cos, sin=sin: apply_rope(q, cos, sin), args.repeat,
                 args.inner)


if __name__ == "__main__":
    main()
