"""bf16 against fp32 for one of the fixture LM's MLP products, on this machine's CPU.

`vlcache.fixture.precision.lm_dtype` runs the frozen LM in bf16 only where the hardware
multiplies bf16 natively; this prints the ratio that choice rests on, measured side by side.

    .venv/bin/python benchmarks/lm_dtype_matmul.py --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from vlcache.fixture.precision import lm_dtype


def seconds_per_product(dtype: torch.dtype, tokens: int, repeats: int) -> float:
    x = torch.randn(tokens, 896, dtype=dtype)  # [tokens, hidden]
    w = torch.randn(4864, 896, dtype=dtype)  # [intermediate, hidden]: Qwen2.5-0.5B's up-projection
    torch.nn.functional.linear(x, w)  # warm-up
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.nn.functional.linear(x, w)
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    fp32 = seconds_per_product(torch.float32, args.tokens, args.repeats)
    bf16 = seconds_per_product(torch.bfloat16, args.tokens, args.repeats)
    print(f"CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"native bf16: {torch.ops.mkldnn._is_mkldnn_bf16_supported()}")
    print(f"[{args.tokens}, 896] x [896, 4864] on {args.threads} thread(s): "
          f"fp32 {fp32:.3f} s, bf16 {bf16:.3f} s, bf16/fp32 {bf16 / fp32:.1f}x")
    print(f"lm_dtype('cpu') chooses {lm_dtype('cpu')}")


if __name__ == "__main__":
    main()
