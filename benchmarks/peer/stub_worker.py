"""A stand-in engine for checking the benchmark without a model: answers like a worker, with a
made-up time of `scale` x (1 + image tokens / 1000) seconds (no sleeping), so ratios between two
stubs are known in advance. `--fail-case` makes every request of one case fail.

    PYTHONPATH=benchmarks python -m peer.stub_worker --name vLLM --scale 2
"""

from __future__ import annotations

import argparse

from peer.protocol import open_channel, send, serve


def fake_answer(messages: list[dict], scale: float) -> dict:
    image_tokens = sum(p["tokens"] for m in messages if isinstance(m["content"], list)
                       for p in m["content"] if p["type"] == "image")
    words = sum(len((p.get("text") or "").split()) for m in messages
                for p in (m["content"] if isinstance(m["content"], list)
                          else [{"text": m["content"]}]))
    return {"ttft_s": scale * (1 + image_tokens / 1000), "cpu_s": 0.0, "cpu_top_s": 0.0,
            "text": "red",
            "prompt_tokens": image_tokens + words, "cached_tokens": 0,
            "computed_tokens": image_tokens + words, "image_tokens": image_tokens}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", default="stub")
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--fail-case", default="")
    p.add_argument("--die-after", type=int, default=0, help="exit after this many requests")
    args = p.parse_args()
    channel = open_channel()
    count = 0

    def handle(request: dict) -> dict:
        nonlocal count
        count += 1
        if args.die_after and count > args.die_after:
            raise SystemExit(3)
        if request.get("case") == args.fail_case:
            raise RuntimeError(f"stub refuses {args.fail_case}")
        return fake_answer(request["messages"], args.scale)

    send(channel, {"engine": args.name, "version": "stub", "torch": "-", "transformers": "-",
                   "settings": {"scale": args.scale}})
    serve(channel, handle)


if __name__ == "__main__":
    main()
