"""A vLLM process answering an image another process saw (hit through vlcache's EC connector)
against a vLLM process without the connector (miss), round by round, same images.

    .venv/bin/python integrations/vllm/benchmarks/ec_two_process.py \
        --vllm-python .venv-vllm/bin/python --tokens 1024 --rounds 3

Process A (connector) answers each round's image first and so saves its encoder output; A is
closed; then B (connector, same store) and C (no connector) start, each answers one warm-up
image of the same size, and then each round's image, alternating which goes first. Prints
per-round times and ratios C/B, and where B's encoder outputs came from.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))  # the `peer` package: its worker protocol
from peer.protocol import Worker  # noqa: E402

WORKER = Path(__file__).with_name("ec_worker.py")
FIXTURE = Path.home() / ".cache/vlcache/fixture-qwen2_5_vl-0.5b"
WARM_UP_SEED = 999


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=FIXTURE)
    p.add_argument("--vllm-python", default=os.environ.get(
        "VLCACHE_VLLM_PYTHON", str(REPO / ".venv-vllm/bin/python")))
    p.add_argument("--tokens", type=int, default=1024, help="image tokens per image")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--store", default="", help="default: a new disk store in a temp dir")
    p.add_argument("--kv-space", default="1", help="VLLM_CPU_KVCACHE_SPACE, GiB")
    p.add_argument("--log", type=Path, default=Path("/tmp/vlcache-ec-bench.log"))
    return p.parse_args()


def start(args: argparse.Namespace, name: str, store: str, log) -> Worker:
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": args.kv_space, "OMP_NUM_THREADS": "1",
           "VLLM_CPU_OMP_THREADS_BIND": "nobind",
           "PYTHONPATH": os.pathsep.join(str(REPO / p) for p in
                                         ("src", "integrations/vllm/src", "benchmarks"))}
    argv = [args.vllm_python, str(WORKER), "--model", str(args.model), "--prefix-caching",
            *(["--store", store] if store else [])]
    t0 = time.monotonic()
    worker = Worker(name, argv, env, log)
    worker.wait_ready(timeout=1800)
    print(f"{name}: started in {time.monotonic() - t0:.0f} s", flush=True)
    return worker


def ask(worker: Worker, args: argparse.Namespace, seed: int) -> dict:
    answer = worker.call({"op": "generate", "tokens": args.tokens, "seed": seed,
                          "max_tokens": 1}, timeout=1800)
    if not answer["ok"]:
        raise RuntimeError(f"{worker.name}: {answer['error']}")
    return answer


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    return next((line.split(":", 1)[1].strip() for line in out.splitlines()
                 if line.startswith("Model name")), "?")


def main() -> None:
    args = parse_args()
    store = args.store or f"disk://{tempfile.mkdtemp(prefix='vlcache-ec-bench-')}"
    seeds = [100 + r for r in range(args.rounds)]
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.tokens} image tokens; "
          f"store {store}; vLLM log {args.log}", flush=True)
    with open(args.log, "a") as log:
        a = start(args, "A", store, log)
        for seed in seeds:
            r = ask(a, args, seed)
            print(f"A  seed {seed}: {r['wall_s']:.2f} s (vision calls {r['vision_calls']}, "
                  f"prompt {r['prompt_tokens']} tokens)", flush=True)
        a.close()
        b, c = start(args, "B", store, log), start(args, "C", "", log)
        try:
            run_rounds(args, b, c, seeds)
        finally:
            b.close()
            c.close()


def run_rounds(args: argparse.Namespace, b: Worker, c: Worker, seeds: list[int]) -> None:
    loaded_s = ask(b, args, WARM_UP_SEED)["counters"]["scheduler"]["load_seconds"]
    ask(c, args, WARM_UP_SEED)
    print(f"{'round':>5} {'B hit s':>8} {'C miss s':>9} {'C/B':>6} {'B vision':>9} "
          f"{'B load ms':>9} {'same':>5}")
    ratios = []
    for i, seed in enumerate(seeds):
        order = [(b, "B"), (c, "C")] if i % 2 == 0 else [(c, "C"), (b, "B")]
        got = {name: ask(w, args, seed) for w, name in order}
        hit, miss = got["B"], got["C"]
        now_s = hit["counters"]["scheduler"]["load_seconds"]  # cumulative
        load_ms, loaded_s = 1000 * (now_s - loaded_s), now_s
        ratios.append(miss["wall_s"] / hit["wall_s"])
        print(f"{i + 1:>5} {hit['wall_s']:>8.2f} {miss['wall_s']:>9.2f} {ratios[-1]:>6.2f} "
              f"{hit['vision_calls']:>9} {load_ms:>9.1f} "
              f"{str(hit['token_ids'] == miss['token_ids']):>5}", flush=True)
    counters = hit["counters"]["scheduler"]
    print(f"median C/B {statistics.median(ratios):.2f}; B's connector (scheduler side, "
          f"cumulative): hits {counters['hits']}, misses {counters['misses']}, damaged "
          f"{counters['damaged']}, load {1000 * counters['load_seconds']:.1f} ms in all")


if __name__ == "__main__":
    main()
