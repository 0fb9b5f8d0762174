"""One decoder layer's seven projections at several row counts: PyTorch's plain `linear` against
the oneDNN-packed weights, one per projection and fused as the engine packs them on the CPU
(q/k/v and gate/up as one weight each; models/packing.py), and the same fused weights packed
for MKL's sgemm (`dual`'s copy for one row and many, fp32 with vlcache's CPU kernels),
alternated in one process (one thread), medians and the median of per-round ratios (per
layer). One layer's weights (~60 MB
in fp32) may stay in the CPU's last-level cache here, unlike a whole model's: `--layers 24`
runs the rows through 24 layers' weights in turn, as a prefill does.

    .venv/bin/python benchmarks/packed_linear.py --hidden 896 --intermediate 4864 --kv 128
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F

from vlcache.models.packing import (
    FusedPackedLinear,
    OuterRows,
    PackedLinear,
    can_pack,
    can_pack_mkl,
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=896)  # the fixture's (Qwen2.5-0.5B) sizes
    p.add_argument("--intermediate", type=int, default=4864)
    p.add_argument("--kv", type=int, default=128, help="K and V projection widths")
    p.add_argument("--rows", default="1,4,12,28,70,256,1052,2061")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=1, help="layers' weights run in turn")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    if not can_pack("cpu", dtype):
        raise SystemExit(f"this PyTorch build cannot pack {args.dtype} weights for oneDNN")
    h, i, kv = args.hidden, args.intermediate, args.kv
    shapes = [(h, h), (kv, h), (kv, h), (h, h), (i, h), (i, h), (h, i)]  # q k v o gate up down
    gen = torch.Generator().manual_seed(0)
    layers = [_layer(shapes, dtype, gen) for _ in range(args.layers)]
    plain = layers[0][0]
    print(f"CPU: {platform.processor() or platform.machine()}; torch {torch.__version__}; "
          f"{args.dtype}; {torch.get_num_threads()} thread(s); q,k,v,o,gate,up,down of "
          f"hidden {h}, intermediate {i}, k/v {kv}; {args.layers} layer(s); {args.rounds} "
          f"rounds alternated\n")
    mkl = can_pack_mkl(dtype)
    print("| rows | plain ms | packed ms | fused ms | MKL-packed ms | plain / packed "
          "| packed / fused | fused / MKL-packed | max abs diff |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for m in (int(r) for r in args.rows.split(",")):
            xs = [torch.randn(m, lin.in_features, generator=gen).to(dtype) for lin in plain]
            fused_xs = [xs[0], xs[3], xs[4], xs[6]]
            inputs = {"plain": xs, "packed": xs, "fused": fused_xs, "mkl": fused_xs}
            times: dict[str, list[float]] = {"plain": [], "packed": [], "fused": []}
            if mkl:
                times["mkl"] = []
            for _ in range(args.rounds + 1):  # the first round warms up, not counted
                for j, name in enumerate(times):
                    start = time.perf_counter()
                    for layer in layers:
                        for x, mod in zip(inputs[name], layer[j], strict=True):
                            mod(x)
                    times[name].append((time.perf_counter() - start) / len(layers))
            a, b, c = times["plain"][1:], times["packed"][1:], times["fused"][1:]
            diff = max((F.linear(x, lin.weight) - pk(x)).abs().max().item()
                       for x, lin, pk in zip(xs, plain, layers[0][1], strict=True))
            ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
            ratio_fused = statistics.median(x / y for x, y in zip(b, c, strict=True))
            mkl_ms = ratio_mkl = "—"
            if mkl:
                d = times["mkl"][1:]
                mkl_ms = f"{statistics.median(d) * 1e3:.2f}"
                ratio_mkl = f"{statistics.median(x / y for x, y in zip(c, d, strict=True)):.2f}"
                diff = max([diff] + [(F.linear(x, lin.weight) - pk(x)[..., :lin.out_features])
                                     .abs().max().item() for x, lin, pk
                                     in zip(fused_xs, (plain[0], plain[3], plain[4], plain[6]),
                                            layers[0][3], strict=True)])
            print(f"| {m} | {statistics.median(a) * 1e3:.2f} | {statistics.median(b) * 1e3:.2f} "
                  f"| {statistics.median(c) * 1e3:.2f} | {mkl_ms} | {ratio:.2f} "
                  f"| {ratio_fused:.2f} | {ratio_mkl} | {diff:.1e} |")


def _layer(shapes: list[tuple[int, int]], dtype: torch.dtype, gen: torch.Generator
           ) -> tuple[list[Callable[[torch.Tensor], torch.Tensor]], ...]:
    """One layer's projections four ways: plain, packed one by one, packed as the engine
    fuses them (q/k/v, o, gate/up, down), and those fused weights packed for MKL (where it
    can be: else an empty list)."""
    plain = [torch.nn.Linear(n_in, n_out, bias=False).to(dtype) for n_out, n_in in shapes]
    for lin in plain:
        lin.weight.data = (torch.randn(lin.weight.shape, generator=gen) / 30).to(dtype)
    q, k, v, o, gate, up, down = plain
    fused = [FusedPackedLinear([q, k, v]), PackedLinear(o), FusedPackedLinear([gate, up]),
             PackedLinear(down)]
    groups = ([q, k, v], [o], [gate, up], [down])
    mkl = [partial(OuterRows(torch.cat([lin.weight.detach() for lin in g])), bias=None)
           for g in groups] if can_pack_mkl(dtype) else []
    return plain, [PackedLinear(lin) for lin in plain], fused, mkl


if __name__ == "__main__":
    main()
