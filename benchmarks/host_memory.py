"""What page faults cost a prefill, and what keeping freed memory (kernels/malloc.py) saves:
one process with glibc's defaults and one with `keep_freed_memory()`, alternating, each timing
(one thread) the gated MLP's up-projection at a long prompt's size, [rows x 896] x
[896 x 9,728] (a fresh 80 MB output each call, as in a prefill), and writing a fresh tensor of
that size, on the main thread and on another thread (as the server's model thread). Ratios
are per round.

    .venv/bin/python benchmarks/host_memory.py --rows 2061 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, threading, time, torch
from vlcache.kernels.malloc import keep_freed_memory
kept = keep_freed_memory()
torch.set_num_threads(1)
rows, cols, hidden = int(sys.argv[1]), 9728, 896
x, w = torch.randn(rows, hidden), torch.randn(cols, hidden)

def med(f, n=7):
    f()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return sorted(times)[n // 2]

def measure(out):
    out.update(gemm=med(lambda: x @ w.t()), write=med(lambda: torch.empty(rows, cols).fill_(1)))

other = {}
worker = threading.Thread(target=measure, args=(other,))
worker.start()
worker.join()
main = {}
measure(main)
print(json.dumps({"kept": kept, "gemm": main["gemm"], "write": main["write"],
                  "thread gemm": other["gemm"], "thread write": other["write"]}))
"""


def run(rows: int, keep: bool) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", VLCACHE_KEEP_FREED_MEMORY="1" if keep else "0")
    out = subprocess.run([sys.executable, "-c", CHILD, str(rows)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2061)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    results: dict[bool, list[dict]] = {False: [], True: []}
    for r in range(args.rounds):
        for keep in ((False, True) if r % 2 == 0 else (True, False)):
            results[keep].append(run(args.rows, keep))
    assert all(x["kept"] for x in results[True]), "glibc refused the thresholds"
    print(f"| {args.rows} rows | glibc defaults ms | freed memory kept ms | ratio (median) |")
    print("|---|---:|---:|---:|")
    gemm, write = f"[{args.rows} x 896] x [896 x 9728], fresh output", "write a fresh " + (
        "80 MB tensor" if args.rows == 2061 else "[rows x 9728] tensor")
    for step, name in (("gemm", gemm), ("write", write), ("thread gemm", f"{gemm}, a thread"),
                       ("thread write", f"{write}, a thread")):
        a = [x[step] for x in results[False]]
        b = [x[step] for x in results[True]]
        ratio = statistics.median(x / y for x, y in zip(a, b, strict=True))
        print(f"| {name} | {statistics.median(a) * 1e3:.1f} | {statistics.median(b) * 1e3:.1f} "
              f"| {ratio:.2f}x |")


if __name__ == "__main__":
    main()
