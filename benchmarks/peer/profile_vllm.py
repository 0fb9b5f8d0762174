"""Where vLLM's time goes in one request of the peer benchmark's kinds (miss or long text after
a cached image), under torch.profiler, its engine in this process, one thread: vLLM's side of
`benchmarks/profile_request.py`. Run it in vLLM's environment, with nothing else running.

    OMP_NUM_THREADS=1 VLLM_CPU_OMP_THREADS_BIND=nobind VLLM_CPU_KVCACHE_SPACE=2 \\
        PYTHONPATH=benchmarks .venv-vllm/bin/python benchmarks/peer/profile_vllm.py \\
        --case long --tokens 1024
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from peer.cases import QUESTION, SYSTEM, long_text
from peer.images import noise_image


def messages(image, after: str = "") -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": [{"type": "image_pil", "image_pil": image},
                                         {"type": "text", "text": after + QUESTION}]}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(Path("~/.cache/vlcache/fixture-qwen2_5_vl-0.5b")
                                          .expanduser()),
                   help="for more than 1,024 image tokens, a copy with the pixel cap raised "
                        "(peer/driver.py's prepare_model, as run.py makes it)")
    p.add_argument("--case", choices=("miss", "long"), default="long")
    p.add_argument("--tokens", type=int, default=1024, help="image tokens")
    p.add_argument("--long-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=9216)
    p.add_argument("--warm", type=int, default=2, help="timed requests before the profiled one")
    p.add_argument("--rows", type=int, default=25, help="operators shown")
    args = p.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process

    from torch.profiler import ProfilerActivity, profile
    from vllm import LLM, SamplingParams

    llm = LLM(model=args.model, dtype="float32", enable_prefix_caching=True,
              max_model_len=args.max_model_len, seed=0,
              limit_mm_per_prompt={"image": 2, "video": 0})
    params = SamplingParams(max_tokens=1, temperature=0)
    cached = noise_image(args.tokens, 11)
    llm.chat(messages(cached), params, use_tqdm=False)  # caches image A's prefix
    llm.chat(messages(noise_image(args.tokens, 12)), params, use_tqdm=False)  # warm-up

    def request(i: int) -> list[dict]:
        if args.case == "miss":
            return messages(noise_image(args.tokens, 100 + i))
        return messages(cached, after=long_text(i, args.long_tokens) + " ")

    for i in range(args.warm):
        start = time.perf_counter()
        out = llm.chat(request(i), params, use_tqdm=False)[0]
        print(f"request {i}: {time.perf_counter() - start:.2f} s, prompt "
              f"{len(out.prompt_token_ids)} tokens, cached {out.num_cached_tokens}")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        out = llm.chat(request(args.warm), params, use_tqdm=False)[0]
        wall = time.perf_counter() - start
    print(f"{args.case}, {args.tokens} image tokens: {wall:.2f} s (under the profiler); prompt "
          f"{len(out.prompt_token_ids)} tokens, cached {out.num_cached_tokens}")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))


if __name__ == "__main__":
    main()
