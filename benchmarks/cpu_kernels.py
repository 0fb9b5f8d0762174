"""vlcache's CPU kernels (src/vlcache/kernels) against the PyTorch operators they replace, one
thread, fp32, side by side (each pair timed alternately, the ratio taken within each repeat):

- attention, a run from position 0: PyTorch's causal flash attention (reuse/attention.py's
  `_causal`) against the kernel;
- attention, a run behind a cached prefix (a long text after a cached image): the two flash
  calls merged by log-sum-exp (`_late_merged`) against the kernel;
- the gated MLP's activation: F.silu(gate) * up against silu_mul.

    .venv/bin/python benchmarks/cpu_kernels.py --rows 284,1052,2061,4124 --prefix 1040
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from elementwise import pair

from vlcache.kernels import cpu_kernels, status
from vlcache.reuse import attention
from vlcache.reuse.attention import RowBlock, attend_blocks


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="284,1052,2061,4124")
    p.add_argument("--prefix", type=int, default=1040, help="cached rows before the late run")
    p.add_argument("--heads", default="14,2,64", help="query heads, KV heads, head dim")
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args()
    if cpu_kernels() is None:
        raise SystemExit(f"vlcache's CPU kernels are unavailable: {status()}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    nh, kvh, d = (int(x) for x in args.heads.split(","))
    kernel = cpu_kernels()

    def pytorch(run):
        def call():
            attention.KERNELS = False
            try:
                return run()
            finally:
                attention.KERNELS = True
        return call

    print("| step, rows | PyTorch ms | vlcache kernel ms | speed-up (median) | min-max |")
    print("|---|---:|---:|---:|---:|")
    with torch.inference_mode():
        for rows in (int(r) for r in args.rows.split(",")):
            inner = max(1, 4000 // rows)
            q = torch.randn(rows, nh, d)
            k, v = (torch.randn(args.prefix + rows, kvh, d) for _ in range(2))

            own, late = [RowBlock.run(0, 0, rows)], [RowBlock.run(0, args.prefix, rows)]

            def run0(q=q, k=k[:rows], v=v[:rows], b=own):
                return attend_blocks(q, k, v, b, d ** -0.5)

            def run1(q=q, k=k, v=v, b=late):
                return attend_blocks(q, k, v, b, d ** -0.5)

            pair(f"attention from 0, {rows}", pytorch(run0), run0, args.repeat, inner)
            pair(f"attention after {args.prefix} cached, {rows}", pytorch(run1), run1,
                 args.repeat, inner)
            x = torch.randn(rows, 2 * args.intermediate)
            g, u = x[:, :args.intermediate], x[:, args.intermediate:]

            def fused(g=g, u=u):
                out = g.new_empty(g.shape)
                kernel.silu_mul(g, u, out)
                return out

            pair(f"silu(gate) * up, {rows}", lambda g=g, u=u: F.silu(g).mul_(u), fused,
                 args.repeat, inner)


if __name__ == "__main__":
    main()
