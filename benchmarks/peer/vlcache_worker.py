"""vlcache in its own process (vlcache's environment): the engine, one torch thread, the policy
given; answers {"op": "generate"} with the request's wall time and what it reused.

    PYTHONPATH=src:benchmarks .venv/bin/python -m peer.vlcache_worker --model DIR
"""

from __future__ import annotations

import argparse
import os
import time

from peer.protocol import cpu_used, open_channel, send, serve, thread_times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--policy", default="static:0.05")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--store", default="memory://?max_bytes=4GB")
    p.add_argument("--unit", type=int, default=28)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = p.parse_args()
    channel = open_channel()

    import torch
    import transformers

    import vlcache
    from peer.images import materialize
    from vlcache import kernels
    from vlcache.engine import Engine
    from vlcache.kernels.malloc import keep_freed_memory
    from vlcache.reuse.registry import parse_policy

    torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained(args.model, store=args.store, dtype=getattr(torch, args.dtype),
                                    device="cpu")
    policy = parse_policy(args.policy)

    def generate(request: dict) -> dict:
        messages = materialize(request["messages"], lambda im: {"type": "image", "image": im},
                               args.unit)
        cpu0, start = thread_times(), time.perf_counter()
        result = engine.generate(messages, policy=policy,
                                 max_tokens=request.get("max_tokens", 1))
        wall = time.perf_counter() - start
        cpu, top = cpu_used(cpu0, thread_times())
        st = result.stats
        computed = st.computed_per_layer
        return {"ttft_s": wall, "cpu_s": cpu, "cpu_top_s": top, "text": result.text,
                "prompt_tokens": st.prompt_tokens, "cached_tokens": st.cached_tokens,
                "computed_tokens": sum(computed) / len(computed) if computed else None,
                "image_tokens": st.image_tokens}

    send(channel, {"engine": "vlcache", "version": vlcache.__version__,
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "settings": {"policy": args.policy, "dtype": args.dtype, "device": "cpu",
                                "packing": engine.packing,
                                "store": args.store,
                                "cpu kernels": kernels.status(),
                                "freed memory kept (glibc)": keep_freed_memory(),
                                "LD_PRELOAD": os.environ.get("LD_PRELOAD", ""),
                                "threads": f"torch.set_num_threads({args.threads}) -> "
                                           f"{torch.get_num_threads()}; OMP_NUM_THREADS="
                                           f"{os.environ.get('OMP_NUM_THREADS')}"}})
    serve(channel, lambda r: generate(r) if r["op"] == "generate" else _unknown(r))


def _unknown(request: dict) -> dict:
    raise ValueError(f"unknown op {request.get('op')!r}")


if __name__ == "__main__":
    main()
