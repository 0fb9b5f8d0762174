"""A small request's latency while a huge one is being refused (issue 22: a 10 MB prompt used to
hold the only model worker for 36 s).

    python benchmarks/huge_prompt.py [--rounds 5]

Starts `vlcache serve`'s app (tiny random model, default limits) on a free loopback port. Each
round sends one huge body, and 20 ms later a small chat request ("hi", 4 tokens, greedy); it
prints the small request's time alone and behind each huge body, the huge one's answer, and the
slowest /health call made while the huge body was in flight.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx
import torch

from vlcache.engine import Engine
from vlcache.models.synthetic import TINY, save_checkpoint
from vlcache.server import ServerConfig, create_app
from vlcache.server.local import serve_in_thread

SMALL = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
HUGE = {
    "10 MB prompt": {"messages": [{"role": "user", "content": "x" * 10_000_000}]},
    "300k one-character messages": {"messages": [{"role": "user", "content": "a"}] * 300_000},
    "200k one-character parts": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}] * 200_000}]},
}


def serve(engine: Engine):
    return serve_in_thread(create_app(engine, ServerConfig("tiny")))


def small(http: httpx.Client) -> float:
    t = time.perf_counter()
    assert http.post("/v1/chat/completions", json=SMALL).status_code == 200
    return time.perf_counter() - t


def behind(base: str, http: httpx.Client, raw: bytes) -> tuple[float, float, str]:
    """(small request's seconds, worst /health seconds, the huge request's status and code)."""
    answer: dict[str, httpx.Response] = {}

    def send() -> None:
        answer["r"] = httpx.post(f"{base}/v1/chat/completions", content=raw, timeout=600,
                                 headers={"content-type": "application/json"})

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(0.02)
    took = small(http)
    worst = 0.0
    while thread.is_alive():
        t = time.perf_counter()
        http.get("/health")
        worst = max(worst, time.perf_counter() - t)
    thread.join()
    r = answer["r"]
    return took, worst, f"{r.status_code} {r.json()['error']['code']}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        engine = Engine.from_pretrained(save_checkpoint(Path(tmp) / "m", TINY["qwen2_5_vl"]))
        with serve(engine) as base, httpx.Client(base_url=base, timeout=600) as http:
            for _ in range(3):
                small(http)  # warm up
            alone = statistics.median(small(http) for _ in range(args.rounds))
            print(f"| huge request | its body | answer | small request behind it (median of "
                  f"{args.rounds}) | alone | worst /health meanwhile |\n|---|---|---|---|---|---|")
            for name, body in HUGE.items():
                raw = json.dumps(body).encode()
                runs = [behind(base, http, raw) for _ in range(args.rounds)]
                took = statistics.median(r[0] for r in runs)
                worst = max(r[1] for r in runs)
                print(f"| {name} | {len(raw) / 1e6:.1f} MB | {runs[0][2]} | {took * 1e3:.0f} ms "
                      f"| {alone * 1e3:.0f} ms | {worst * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
