"""`vlcache generate`: send one or more requests through one engine and show what was reused."""

from __future__ import annotations

import argparse
import json
import sys

from vlcache.commands.device import add_device_arguments, device_and_dtype


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, help="local checkpoint directory")
    p.add_argument("--image", action="append", default=[],
                   help="image file for the i-th request (repeatable; the last one is reused)")
    p.add_argument("--prompt", action="append", required=True,
                   help="question for the i-th request (repeatable: one request each)")
    p.add_argument("--system", action="append", default=[],
                   help="system prompt for the i-th request (repeatable; optional)")
    p.add_argument("--policy", "--plan", dest="policy", default=None,
                   help="full | encoder | naive | static:R | plan:FILE.json "
                        "(default: the engine's)")
    p.add_argument("--store", default=None, help="store address (default memory://)")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)
    add_device_arguments(p)
    p.add_argument("--json", action="store_true", help="print one JSON object per answer")


def _messages(args: argparse.Namespace, i: int) -> list[dict]:
    content: list[dict] = []
    if args.image:
        content.append({"type": "image", "image": args.image[min(i, len(args.image) - 1)]})
    content.append({"type": "text", "text": args.prompt[i]})
    messages = []
    if args.system:
        messages.append({"role": "system", "content": args.system[min(i, len(args.system) - 1)]})
    return messages + [{"role": "user", "content": content}]


def run(args: argparse.Namespace) -> int:
    from vlcache.engine import Engine, RequestError
    from vlcache.engine.engine import DEFAULT_POLICY
    from vlcache.models.loading import ModelLoadError

    try:
        device, dtype = device_and_dtype(args)
        engine = Engine.from_pretrained(args.model, store=args.store,
                                        policy=args.policy or DEFAULT_POLICY,
                                        dtype=dtype, device=device, packing=args.packing)
    except (ModelLoadError, ValueError) as e:
        print(f"vlcache generate: {e}", file=sys.stderr)
        return 2
    for i in range(len(args.prompt)):
        try:
            result = engine.generate(_messages(args, i), max_tokens=args.max_tokens,
                                     temperature=args.temperature, top_p=args.top_p,
                                     seed=args.seed)
        except RequestError as e:
            print(f"vlcache generate: request {i + 1}: {e}", file=sys.stderr)
            return 2
        s = result.stats
        if args.json:
            print(json.dumps({"request": i + 1, "prompt": args.prompt[i], "answer": result.text,
                              "finish_reason": result.finish_reason, "stats": s.to_dict()}))
            continue
        source = ("served from the cache" if s.images_kv_reused else
                  "vision tower skipped" if s.images_hit else
                  "computed (cache miss)" if s.images else "no image")
        print(f"[{i + 1}] Q: {args.prompt[i]}\n    A: {result.text}")
        print(f"    image: {source}; reused {s.cached_tokens}/{s.image_tokens} image tokens "
              f"(policy {s.policy}); vision {s.vision_s * 1e3:.0f} ms, "
              f"TTFT {s.ttft_s * 1e3:.0f} ms")
    return 0
