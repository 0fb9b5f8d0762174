"""bf16 against fp32 on the CPU: the fixture's held-out questions answered by two engines over
the same checkpoint, one in each dtype (`full` policy, greedy, 6 tokens): how often the answers
agree, each one's accuracy, the KL divergence of the first answer token's distribution, and the
time per question.

    .venv/bin/python benchmarks/bf16_check.py -n 100
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

import torch

from vlcache.engine import Engine
from vlcache.workloads.synthetic import heldout
from vlcache_fixture.prompt import normalize  # how the fixture's own eval compares answers


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path("~/.cache/vlcache/fixture-qwen2_5_vl-0.5b")
                                          .expanduser()))
    p.add_argument("-n", type=int, default=100, help="held-out questions (balanced types)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engines = {name: Engine.from_pretrained(args.model, store="memory://", policy="full",
                                            dtype=dtype, device="cpu")
               for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16))}
    right = {name: 0 for name in engines}
    agree, kls = 0, []
    seconds: dict[str, list[float]] = {name: [] for name in engines}
    by_type: dict[str, list[bool]] = {}
    examples = heldout(args.n)
    for i, ex in enumerate(examples):
        messages = [{"role": "user", "content": [{"type": "image", "image": ex.image},
                                                 {"type": "text", "text": ex.question}]}]
        answers, first = {}, {}
        for name, engine in engines.items():
            start = time.perf_counter()
            run = engine.prefill(messages, max_new_tokens=6, store_entries=False)
            tokens = engine.decode_greedy(run, 6)
            seconds[name].append(time.perf_counter() - start)
            answers[name] = normalize(engine.decode_text(tokens))
            first[name] = torch.log_softmax(run.output.logits.float(), dim=-1)  # [V]
            right[name] += answers[name] == normalize(ex.answer)
        same = answers["fp32"] == answers["bf16"]
        agree += same
        by_type.setdefault(ex.qtype, []).append(same)
        p32 = first["fp32"].exp()
        kls.append(float((p32 * (first["fp32"] - first["bf16"])).sum()))
        print(f"{i + 1}/{len(examples)} {ex.qtype}: fp32 {answers['fp32']!r} bf16 "
              f"{answers['bf16']!r} truth {ex.answer!r}", flush=True)
    n = len(examples)
    print(f"\n{args.model}, {n} held-out questions, {args.threads} thread(s), `full` policy, "
          f"greedy 6 tokens\n")
    print("| | fp32 | bf16 |\n|---|---:|---:|")
    print(f"| right answers | {right['fp32']}/{n} | {right['bf16']}/{n} |")
    print(f"| median seconds per question | {statistics.median(seconds['fp32']):.2f} | "
          f"{statistics.median(seconds['bf16']):.2f} |")
    low, high = _wilson(agree, n)
    print(f"\nbf16 answer = fp32 answer: {agree}/{n} ({100 * agree / n:.0f}%, 95% CI "
          f"{100 * low:.0f}–{100 * high:.0f}%); by type: "
          + ", ".join(f"{t} {sum(v)}/{len(v)}" for t, v in sorted(by_type.items())))
    print(f"KL(fp32 || bf16) of the first answer token: median {statistics.median(kls):.2e}, "
          f"max {max(kls):.2e}")


def _wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


if __name__ == "__main__":
    main()
