"""A moved image inside one vLLM process: vLLM's own prompt against vlcache's reuse, side by side.

One vLLM (vlcache's worker and Qwen2.5-VL class, eager, prefix caching on) answers:
1. the image (a synthetic VQA scene the fixture was trained on, vlcache.workloads.synthetic,
   drawn at the size that gives --tokens image tokens) after system prompt A with "Describe
   this image." (vlcache asked: a miss, its pre-RoPE KV saved to the store; a hit when --store
   already holds it from an earlier run), then the same prompt with `static:0` (every image
   row's KV from the entry, in the context it was computed in: must give vLLM's tokens);
2. the *moved* prompt (system prompt B, the scene's question before the image) three ways:
   vLLM alone, vlcache `static:1.0`, vlcache `--policy` (default `static:0.05`): once with
   --check-tokens greedy tokens (compared with vLLM's), then --rounds timed rounds with
   --max-tokens (1: the prefill), alternating the order; each request has a fresh cache_salt,
   so no prefix-cache hit helps any of them;
3. with --batch K, K moved prompts of K different scenes at once (half with reuse at
   static:1.0, half without), checked against the same prompts answered one by one without
   reuse, then all K with --policy at once.

--plain-compiled instead times vLLM's own moved prompt with torch.compile and without vlcache's
worker (the default deployment); --ec adds stage 1's encoder-cache connector on the same store
(run twice on one --store: the second process reuses KV and encoder output). Prints a table
and, with --json, writes the figures. Run in vLLM's environment:

    PYTHONPATH=src:integrations/vllm/src:benchmarks .venv-vllm/bin/python \
        integrations/vllm/benchmarks/reuse_moved.py --model DIR --tokens 1024 --rounds 3
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import statistics
import tempfile
import time
import uuid

FIRST = ("You are a helpful assistant.", "Describe this image.")
MOVED_SYSTEM = "You are a careful visual assistant. Look at the picture below the question."
WORKER = "vlcache_vllm.reuse.worker.VlcacheWorker"


def build(args: argparse.Namespace, store: str):  # -> vllm.LLM
    from vllm import LLM

    if args.plain_compiled:  # vLLM as deployed: its own worker, torch.compile on
        return LLM(model=args.model, dtype="float32", max_model_len=args.max_model_len, seed=0,
                   distributed_executor_backend="uni", enable_prefix_caching=True,
                   limit_mm_per_prompt={"image": 1, "video": 0})
    ec = None
    if args.ec:  # stage 1's encoder-cache connector on the same store: no vision tower on a hit
        from vllm.config import ECTransferConfig

        from vlcache_vllm import CONNECTOR, CONNECTOR_MODULE

        ec = ECTransferConfig(ec_connector=CONNECTOR, ec_connector_module_path=CONNECTOR_MODULE,
                              ec_role="ec_both", ec_connector_extra_config={"store": store})
    # "uni": the worker inside the engine process (two processes of the 2.4 GB fixture in fp32
    # did not fit beside other jobs here: the worker was killed for memory)
    return LLM(model=args.model, dtype="float32", max_model_len=args.max_model_len, seed=0,
               enforce_eager=True, distributed_executor_backend="uni",
               enable_prefix_caching=True, worker_cls=WORKER,
               additional_config={"vlcache": {"store": store, "policy": args.policy}},
               ec_transfer_config=ec, limit_mm_per_prompt={"image": 1, "video": 0})


def prompt_text(processor, system: str, parts: list[str]) -> str:
    content = [{"type": "image"} if p == "<image>" else {"type": "text", "text": p}
               for p in parts]
    messages = [{"role": "system", "content": system}, {"role": "user", "content": content}]
    return processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=1024, help="image tokens")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=1, help="in the timed rounds")
    p.add_argument("--check-tokens", type=int, default=8, help="in the token comparison")
    p.add_argument("--policy", default="static:0.05")
    p.add_argument("--batch", type=int, default=0, help="also K moved prompts at once")
    p.add_argument("--store", default="", help="a vlcache store (default: a temporary dir)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--json", default="")
    p.add_argument("--plain-compiled", action="store_true",
                   help="only vLLM's own moved prompt, compiled (no vlcache worker)")
    p.add_argument("--only-first", action="store_true",
                   help="stop after the first prompt and its static:0 check")
    p.add_argument("--ec", action="store_true",
                   help="also stage 1's encoder-cache connector on the same store")
    p.add_argument("--verbose", action="store_true", help="vlcache's per-step log lines")
    p.add_argument("--stacks", type=float, default=0,
                   help="dump every thread's stack every this many seconds (debugging)")
    args = p.parse_args()
    if args.verbose:  # the worker's per-step lines (it runs in this process: "uni")
        logging.basicConfig(format="%(name)s %(message)s")
        logging.getLogger("vlcache_vllm").setLevel(logging.DEBUG)
    if args.stacks:
        faulthandler.dump_traceback_later(args.stacks, repeat=True)
    os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the probes below

    from transformers import AutoProcessor
    from vllm import SamplingParams

    from vlcache_vllm.probe import count_vision_calls
    from vlcache_vllm.reuse.probe import reuse_counters

    store = args.store or f"disk://{tempfile.mkdtemp(prefix='vlcache-vllm-kv-')}"
    processor = AutoProcessor.from_pretrained(args.model)
    first = prompt_text(processor, FIRST[0], ["<image>", FIRST[1]])
    scene = example(args.tokens, 0)
    moved = prompt_text(processor, MOVED_SYSTEM, [scene.question, "<image>"])
    llm = build(args, store)
    llm.collective_rpc(count_vision_calls)

    def ask(texts: list[str], images: list, policies: list[str | None],
            max_tokens: int = args.check_tokens) -> dict:
        prompts, params = [], []
        for text, image, policy in zip(texts, images, policies, strict=True):
            prompts.append({"prompt": text, "multi_modal_data": {"image": image},
                            "cache_salt": uuid.uuid4().hex})
            extra = None if policy is None else {"vlcache": policy}
            params.append(SamplingParams(max_tokens=max_tokens, temperature=0,
                                         extra_args=extra))
        calls = llm.collective_rpc(count_vision_calls)[0]
        start = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        return {"wall_s": wall, "tokens": [list(o.outputs[0].token_ids) for o in outs],
                "texts": [o.outputs[0].text for o in outs],
                "prompt_tokens": [len(o.prompt_token_ids) for o in outs],
                "vision_calls": llm.collective_rpc(count_vision_calls)[0] - calls}

    image = scene.image
    if args.plain_compiled:
        plain_compiled(args, ask, first, moved, image, example(args.tokens, 99).image)
        return
    warm = ({"wall_s": 0.0} if args.only_first  # else first-call costs, out of the timings
            else ask([moved], [example(args.tokens, 99).image], [None]))
    saved = ask([first], [image], [args.policy])
    counters = llm.collective_rpc(reuse_counters)[0]
    print(f"warm-up {warm['wall_s']:.2f} s; first prompt {saved['wall_s']:.2f} s, "
          f"{saved['prompt_tokens'][0]} tokens, {saved['vision_calls']} vision-tower calls; "
          f"store {counters}")
    # the saved prompt itself with every image token reused at every layer (static:0): the
    # entry's KV is exactly this context's, so only rotation and paged writes can differ
    plain, reused = ask([first], [image], [None]), ask([first], [image], ["static:0"])
    same_context = plain["tokens"] == reused["tokens"]
    print(f"saved prompt again, static:0 (all image KV from the entry): same tokens as vLLM "
          f"{same_context} ({reused['texts'][0]!r})")
    if args.only_first:  # e.g. a second process on the same --store, with --ec
        print(f"store {llm.collective_rpc(reuse_counters)[0]}; static:0 prompt "
              f"{reused['vision_calls']} vision-tower calls")
        return
    arms = {"vllm": None, "static:1.0": "static:1.0", args.policy: args.policy}
    checked = {arm: ask([moved], [image], [policy]) for arm, policy in arms.items()}
    reference = checked["vllm"]["tokens"][0]
    rows: dict[str, list[dict]] = {arm: [] for arm in arms}
    for r in range(args.rounds):
        order = list(arms) if r % 2 == 0 else list(reversed(arms))
        for arm in order:
            rows[arm].append(ask([moved], [image], [arms[arm]], args.max_tokens))
    print(f"\nmoved prompt: {checked['vllm']['prompt_tokens'][0]} tokens, {args.tokens} image "
          f"tokens; question {scene.question!r} (answer {scene.answer!r})")
    print(f"timed: max_tokens {args.max_tokens}, {args.rounds} rounds; tokens compared: "
          f"{args.check_tokens} greedy")
    print(f"{'arm':<14}{'median s':>10}{'all s':>26}{'vllm / arm':>12}  same tokens  answer")
    base = statistics.median(x["wall_s"] for x in rows["vllm"])
    summary = {}
    for arm, results in rows.items():
        med = statistics.median(x["wall_s"] for x in results)
        same = checked[arm]["tokens"][0] == reference
        walls = " ".join(f"{x['wall_s']:.2f}" for x in results)
        print(f"{arm:<14}{med:>10.2f}{walls:>26}{base / med:>12.2f}  {str(same):<11}  "
              f"{checked[arm]['texts'][0]!r}")
        summary[arm] = {"median_s": med, "walls": [x["wall_s"] for x in results],
                        "same_tokens": same, "text": checked[arm]["texts"][0],
                        "tokens": checked[arm]["tokens"][0],
                        "vision_calls": [x["vision_calls"] for x in results]}
    report = {"tokens": args.tokens, "reference": reference, "arms": summary,
              "first_prompt": {"wall_s": saved["wall_s"], "vision_calls": saved["vision_calls"],
                               "store_before": counters},
              "same_context_static0": same_context, "answer": scene.answer,
              "saved": saved["tokens"][0]}
    if args.batch:
        report["batch"] = batched(args, ask, processor, first)
    report["store"] = llm.collective_rpc(reuse_counters)[0]
    print(f"store {report['store']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


def plain_compiled(args: argparse.Namespace, ask, first: str, moved: str, image,
                   other) -> None:
    """The baseline as vLLM runs by default (compiled): the same warm-up, first prompt and
    moved prompt, timed the same way."""
    ask([moved], [other], [None])
    ask([first], [image], [None])
    checked = ask([moved], [image], [None])
    walls = [ask([moved], [image], [None], args.max_tokens)["wall_s"] for _ in range(args.rounds)]
    print(f"\nvLLM compiled, moved prompt {checked['prompt_tokens'][0]} tokens: median "
          f"{statistics.median(walls):.2f} s ({' '.join(f'{w:.2f}' for w in walls)}), "
          f"tokens {checked['tokens'][0]} {checked['texts'][0]!r}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"walls": walls, "tokens": checked["tokens"][0]}, f)


def example(tokens: int, index: int):  # -> vlcache.workloads.synthetic.Example
    """A fixture scene drawn at the size that gives `tokens` image tokens (28-pixel units)."""
    from peer.images import grid_for

    from vlcache.workloads.synthetic import make_example

    rows, cols = grid_for(tokens)
    if rows != cols:
        raise ValueError(f"--tokens {tokens}: a square number of tokens, e.g. 256 or 1024")
    return make_example(seed=7, index=index, sides=(28 * rows, 28 * rows))


def batched(args: argparse.Namespace, ask, processor, first: str) -> dict:
    """K scenes: each saved once, then all K moved prompts at once (even ones with reuse at
    static:1.0, odd ones without), against each answered alone without reuse."""
    scenes = [example(args.tokens, 10 + i) for i in range(args.batch)]
    images = [s.image for s in scenes]
    moved = [prompt_text(processor, MOVED_SYSTEM, [s.question, "<image>"]) for s in scenes]
    ask([first] * args.batch, images, [args.policy] * args.batch)  # K misses saved, batched
    alone = [ask([m], [im], [None])["tokens"][0] for m, im in zip(moved, images, strict=True)]
    policies = ["static:1.0" if i % 2 == 0 else None for i in range(args.batch)]
    together = ask(moved, images, policies)
    same = [a == b for a, b in zip(alone, together["tokens"], strict=True)]
    fast = ask(moved, images, [args.policy] * args.batch)
    print(f"\nbatch of {args.batch}: static:1.0/none mix same tokens as alone: {same}; "
          f"all {args.policy} at once {fast['wall_s']:.2f} s, answers {fast['texts']}")
    return {"same": same, "policies": policies, "alone": alone, "together": together["tokens"],
            "fast_wall_s": fast["wall_s"], "fast_tokens": fast["tokens"],
            "answers": [s.answer for s in scenes], "fast_texts": fast["texts"],
            "alone_texts": [processor.tokenizer.decode(t) for t in alone]}


if __name__ == "__main__":
    main()
