"""vLLM's CPU build in its own process (vLLM's environment): offline `LLM`, fp32, prefix
caching on; answers {"op": "generate"} with the request's wall time and its prefix-cache hit.
Threads: the driver sets OMP_NUM_THREADS=1 and VLLM_CPU_OMP_THREADS_BIND=nobind, so vLLM's
engine core, like vlcache, runs one OpenMP thread the OS schedules (not pinned to a core).

    PYTHONPATH=benchmarks .venv-vllm/bin/python -m peer.vllm_worker --model DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time

from peer.protocol import cpu_used, open_channel, send, serve, thread_times

ENV_SHOWN = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE",
             "LD_PRELOAD")


def settings(llm, kwargs: dict) -> dict:
    """What the engine actually runs with, read back from its config."""
    c = llm.llm_engine.vllm_config
    read = {"prefix caching": lambda: c.cache_config.enable_prefix_caching,
            "block size": lambda: c.cache_config.block_size,
            "max_num_batched_tokens": lambda: c.scheduler_config.max_num_batched_tokens,
            "chunked prefill": lambda: c.scheduler_config.enable_chunked_prefill,
            "compilation": lambda: (f"{c.compilation_config.mode.name}, backend "
                                    f"{c.compilation_config.backend}"),
            "dtype": lambda: str(c.model_config.dtype)}
    out: dict = {"LLM(...)": kwargs}
    for name, get in read.items():
        try:
            out[name] = get()
        except AttributeError as e:  # a renamed field must not stop the run
            out[name] = f"? ({e})"
    out["env"] = {k: os.environ[k] for k in ENV_SHOWN if k in os.environ}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument("--images", type=int, default=2, help="most images in one prompt")
    p.add_argument("--extra", default="{}", help="more LLM(...) keyword arguments, as JSON")
    p.add_argument("--unit", type=int, default=28)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args()
    channel = open_channel()

    import torch
    import transformers
    import vllm
    from vllm import LLM, SamplingParams

    from peer.images import materialize

    kwargs = {"model": args.model, "dtype": args.dtype, "enable_prefix_caching": True,
              "max_model_len": args.max_model_len, "seed": 0,
              "limit_mm_per_prompt": {"image": args.images, "video": 0},
              **json.loads(args.extra)}
    llm = LLM(**kwargs)

    def generate(request: dict) -> dict:
        messages = materialize(request["messages"],
                               lambda im: {"type": "image_pil", "image_pil": im}, args.unit)
        params = SamplingParams(max_tokens=request.get("max_tokens", 1), temperature=0)
        cpu0, start = thread_times(), time.perf_counter()
        out = llm.chat(messages, params, use_tqdm=False)[0]
        wall = time.perf_counter() - start
        cpu, top = cpu_used(cpu0, thread_times())
        prompt = len(out.prompt_token_ids or [])
        cached = out.num_cached_tokens or 0
        return {"ttft_s": wall, "cpu_s": cpu, "cpu_top_s": top, "text": out.outputs[0].text,
                "prompt_tokens": prompt, "cached_tokens": cached,
                "computed_tokens": prompt - cached}

    send(channel, {"engine": "vLLM", "version": vllm.__version__, "torch": torch.__version__,
                   "transformers": transformers.__version__, "settings": settings(llm, kwargs)})
    serve(channel, lambda r: generate(r) if r["op"] == "generate" else _unknown(r))


def _unknown(request: dict) -> dict:
    raise ValueError(f"unknown op {request.get('op')!r}")


if __name__ == "__main__":
    main()
