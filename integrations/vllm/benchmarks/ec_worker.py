"""One vLLM process (vLLM's environment), with or without vlcache's EC connector, answering
JSON lines (benchmarks/peer/protocol.py): {"op": "generate", "tokens", "seed"} asks about a
noise image of that many image tokens; {"op": "reset"} empties vLLM's own encoder cache.
Answers carry the wall time, the token ids, vision-tower calls and the connector's counters.

    PYTHONPATH=src:integrations/vllm/src:benchmarks .venv-vllm/bin/python \
        integrations/vllm/benchmarks/ec_worker.py --model DIR --store disk:///tmp/ec
"""

from __future__ import annotations

import argparse
import os
import time

from peer.protocol import open_channel, send, serve

QUESTION = "What is in this image? Answer in a few words."


def build(args: argparse.Namespace):  # -> vllm.LLM
    from vllm import LLM
    from vllm.config import ECTransferConfig

    from vlcache_vllm import CONNECTOR, CONNECTOR_MODULE

    ec = None
    if args.store:
        ec = ECTransferConfig(ec_connector=CONNECTOR, ec_connector_module_path=CONNECTOR_MODULE,
                              ec_role="ec_both",
                              ec_connector_extra_config={"store": args.store})
    return LLM(model=args.model, dtype="float32", max_model_len=args.max_model_len, seed=0,
               enable_prefix_caching=args.prefix_caching,
               limit_mm_per_prompt={"image": 1, "video": 0}, ec_transfer_config=ec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--store", default="", help="a vlcache store address; none: no connector")
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--prefix-caching", action="store_true")
    args = p.parse_args()
    channel = open_channel()
    # collective_rpc sends the probe functions (vlcache_vllm.probe) to vLLM's worker process
    # pickled; vLLM 0.32 refuses pickled functions unless this is set. Only this harness needs
    # it, never the connector.
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")

    import vllm
    from peer.images import noise_image
    from vllm import SamplingParams

    from vlcache_vllm.probe import connector_counters, count_vision_calls

    llm = build(args)
    llm.collective_rpc(count_vision_calls)  # installs the counter

    def generate(request: dict) -> dict:
        image = noise_image(request["tokens"], request["seed"])
        messages = [{"role": "user", "content": [{"type": "image_pil", "image_pil": image},
                                                 {"type": "text", "text": QUESTION}]}]
        params = SamplingParams(max_tokens=request.get("max_tokens", 1), temperature=0)
        calls0 = llm.collective_rpc(count_vision_calls)[0]
        start = time.perf_counter()
        out = llm.chat(messages, params, use_tqdm=False)[0]
        wall = time.perf_counter() - start
        return {"wall_s": wall, "text": out.outputs[0].text,
                "token_ids": list(out.outputs[0].token_ids),
                "prompt_tokens": len(out.prompt_token_ids or []),
                "vision_calls": llm.collective_rpc(count_vision_calls)[0] - calls0,
                "counters": llm.collective_rpc(connector_counters)[0]}

    def handle(request: dict) -> dict:
        if request["op"] == "generate":
            return generate(request)
        if request["op"] == "reset":  # vLLM's own encoder cache, so the next ask is a lookup
            llm.llm_engine.reset_encoder_cache()
            llm.reset_prefix_cache()
            return {}
        raise ValueError(f"unknown op {request['op']!r}")

    send(channel, {"engine": "vLLM", "version": vllm.__version__, "store": args.store})
    serve(channel, handle)


if __name__ == "__main__":
    main()
