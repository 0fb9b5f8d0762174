"""Whole requests with vlcache's CPU kernels and its freed-memory setting switched off and on:
one process per variant (the switches are environment variables read at start), variants
alternated per round, one thread, the fixture checkpoint. Each process caches a 256-token image,
warms up, then times a 256-token miss, a 1,024-token miss, a ~2,048-token text after the cached
image, and the cached prompt again.

    .venv/bin/python benchmarks/kernels_ab.py --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

VARIANTS = {
    "neither": {"VLCACHE_CPU_KERNELS": "0", "VLCACHE_KEEP_FREED_MEMORY": "0"},
    "kernels": {"VLCACHE_CPU_KERNELS": "1", "VLCACHE_KEEP_FREED_MEMORY": "0"},
    "kernels + freed memory": {"VLCACHE_CPU_KERNELS": "1", "VLCACHE_KEEP_FREED_MEMORY": "1"},
}
CHILD = r"""
import json, random, sys, time, torch
from peer.cases import QUESTION, SYSTEM, WORDS
from peer.images import noise_image
from vlcache.engine import Engine

torch.set_num_threads(1)
model, r = sys.argv[1], int(sys.argv[2])
engine = Engine.from_pretrained(model, store="memory://?max_bytes=4GB", dtype=torch.float32,
                                device="cpu")

def ask(img, after=""):
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "image", "image": img},
                                         {"type": "text", "text": after + QUESTION}]}]

cached = noise_image(256, 1)
engine.generate(ask(cached), max_tokens=1)
engine.generate(ask(noise_image(256, 2)), max_tokens=1)  # warm-up
long = " ".join(random.Random(r).choice(WORDS) for _ in range(2048)) + ". "
requests = {"miss, 256 tokens": ask(noise_image(256, 100 + r)),
            "miss, 1,024 tokens": ask(noise_image(1024, 200 + r)),
            "long text after a cached 256-token image": ask(cached, long),
            "same prompt, 256 tokens": ask(cached)}
out = {}
for name, messages in requests.items():
    start = time.perf_counter()
    engine.generate(messages, max_tokens=1)
    out[name] = time.perf_counter() - start
print("RESULT " + json.dumps(out))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path("~/.cache/vlcache/fixture-qwen2_5_vl-0.5b")
                                          .expanduser()))
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    repo = Path(__file__).resolve().parents[1]
    names = list(VARIANTS)
    times: dict[str, list[dict]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            env = {**os.environ, "OMP_NUM_THREADS": "1", **VARIANTS[name],
                   "PYTHONPATH": os.pathsep.join([str(repo / "src"), str(repo / "benchmarks")])}
            run = subprocess.run([sys.executable, "-c", CHILD, args.model, str(r)], env=env,
                                 capture_output=True, text=True, check=True)
            line = next(x for x in run.stdout.splitlines() if x.startswith("RESULT "))
            times[name].append(json.loads(line[len("RESULT "):]))
            print(f"round {r}, {name}: done", file=sys.stderr, flush=True)
    print("| request | " + " | ".join(f"{n} s" for n in names) + " |")
    print("|---|" + "---:|" * len(names))
    for request in times[names[0]][0]:
        cells = []
        for n in names:
            values = [t[request] for t in times[n]]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})")
        print(f"| {request} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
