"""A bounded load run against `vlcache serve` on loopback: requests/s and TTFT percentiles.

Clients stream chat completions; a request's TTFT is the time to the first chunk that carries
text. A share of requests (`--repeat-fraction`) sends one of a few popular images again, the rest
a fresh one, so the run shows what the cache does under a mix.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from vlcache.bench.images import synth_image


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="a running server's base URL (http://127.0.0.1:PORT)")
    src.add_argument("--model", help="start `vlcache serve --model DIR` on a free loopback port")
    p.add_argument("--policy", default=None, help="with --model: the server's policy")
    p.add_argument("--threads", type=int, default=None, help="with --model: torch threads")
    p.add_argument("--requests", type=int, default=48, help="total requests (default 48)")
    p.add_argument("--concurrency", type=int, default=4, help="clients at once (default 4)")
    p.add_argument("--repeat-fraction", type=float, default=0.75,
                   help="share of requests that send a popular image again (default 0.75)")
    p.add_argument("--popular", type=int, default=4, help="popular images (default 4)")
    p.add_argument("--image-tokens", type=int, default=256, help="tokens per image (default 256)")
    p.add_argument("--max-tokens", type=int, default=8, help="tokens to generate (default 8)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output prefix (default docs/bench/server)")


@dataclass
class Outcome:
    kind: str  # "repeat" (the image was sent before) | "new"
    status: int
    ttft_s: float | None
    latency_s: float
    cached_tokens: int = 0


def _png_url(tokens: int, seed: int) -> str:
    buf = io.BytesIO()
    synth_image(tokens, 28, seed).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _bodies(args: argparse.Namespace, model: str) -> list[tuple[str, dict]]:
    rng = random.Random(args.seed)
    popular = [_png_url(args.image_tokens, args.seed + i) for i in range(args.popular)]
    bodies, sent = [], set()
    for i in range(args.requests):
        if rng.random() < args.repeat_fraction:
            url = rng.choice(popular)
        else:
            url = _png_url(args.image_tokens, 10**6 + i)
        repeat = url in sent  # the first send of a popular image is new to the cache too
        sent.add(url)
        content = [{"type": "text", "text": f"Question {i}: what is shown?"},
                   {"type": "image_url", "image_url": {"url": url}}]
        bodies.append(("repeat" if repeat else "new", {
            "model": model, "messages": [{"role": "user", "content": content}],
            "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}))
    return bodies


async def _one(client, base: str, kind: str, body: dict) -> Outcome:
    start = time.perf_counter()
    ttft, cached = None, 0
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as resp:
        if resp.status_code != 200:
            await resp.aread()
            return Outcome(kind, resp.status_code, None, time.perf_counter() - start)
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if ttft is None and any(c.get("delta", {}).get("content")
                                    for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached)
    return Outcome(kind, 200, ttft, time.perf_counter() - start, cached or 0)


async def _load(base: str, bodies: list[tuple[str, dict]], concurrency: int) -> list[Outcome]:
    import httpx

    todo = list(reversed(bodies))
    outcomes: list[Outcome] = []
    async with httpx.AsyncClient(timeout=600) as client:
        async def worker() -> None:
            while todo:
                kind, body = todo.pop()
                outcomes.append(await _one(client, base, kind, body))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return outcomes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    import httpx

    port = _free_port()
    cmd = [sys.executable, "-m", "vlcache.cli", "serve", "--model", args.model,
           "--port", str(port), "--log-level", "warning",
           "--max-image-pixels", str(max(40_000_000, args.image_tokens * 28 * 28))]
    cmd += ["--policy", args.policy] if args.policy else []
    cmd += ["--threads", str(args.threads)] if args.threads else []
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.terminate()
    raise RuntimeError("the server did not become healthy")


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summary(outcomes: list[Outcome], wall_s: float) -> list[dict]:
    """One row per request kind and one for all: counts, requests/s, TTFT percentiles."""
    rows = []
    for kind in ("repeat", "new", "all"):
        mine = [o for o in outcomes if kind in ("all", o.kind)]
        ok = [o for o in mine if o.status == 200]
        ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
        rows.append({"kind": kind, "requests": len(mine), "ok": len(ok),
                     "requests_per_s": len(ok) / wall_s if kind == "all" else None,
                     "ttft_p50_s": _pct(ttft, 0.5), "ttft_p90_s": _pct(ttft, 0.9),
                     "ttft_p99_s": _pct(ttft, 0.99),
                     "latency_p50_s": statistics.median([o.latency_s for o in ok]) if ok else None,
                     "cached_tokens_mean": statistics.mean([o.cached_tokens for o in ok])
                     if ok else None})
    return rows


def _markdown(rows: list[dict], caption: str) -> str:
    keys = list(rows[0])
    lines = [caption, "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join("" if r[k] is None else
                                       (f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]))
                                       for k in keys) + " |")
    return "\n".join(lines) + "\n"


def _command(args: argparse.Namespace) -> str:
    words = ["vlcache", "bench", "server"]
    words += ["--url", args.url] if args.url else ["--model", args.model]
    words += ["--policy", args.policy] if args.policy else []
    words += ["--threads", str(args.threads)] if args.threads else []
    for name in ("requests", "concurrency", "repeat_fraction", "popular", "image_tokens",
                 "max_tokens", "seed"):
        words += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    return " ".join(words)


def run(args: argparse.Namespace) -> int:
    proc, base = (None, args.url.rstrip("/")) if args.url else _start_server(args)
    try:
        import httpx

        model = httpx.get(f"{base}/v1/models", timeout=10).json()["data"][0]["id"]
        bodies = _bodies(args, model)
        start = time.perf_counter()
        outcomes = asyncio.run(_load(base, bodies, args.concurrency))
        wall = time.perf_counter() - start
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    rows = summary(outcomes, wall)
    caption = f"Command: `{_command(args)}`; wall {wall:.1f} s."
    text = _markdown(rows, caption)
    print(text)
    out = Path(args.out or "docs/bench/server")
    out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{out}.md").write_text(text)
    Path(f"{out}.json").write_text(json.dumps({"caption": caption, "rows": rows}, indent=2))
    return 0
