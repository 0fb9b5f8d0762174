"""`/metrics` scrape latency with a large Redis store (issue 22: a scrape used to count the store).

    python benchmarks/metrics_scrape.py [--entries 200000] [--scrapes 200] [--redis URL]

Fills Redis with `--entries` small real entries (each encoded by the store's codec for its own
key and written as the Redis store lays it out, chunk then manifest, in pipelined batches), then
times: the exact count each scrape used to do, the background `recount()`, `/metrics` scrapes
against a running server (tiny random model) while recounts run, and `/metrics` and `/health`
with Redis frozen (SIGSTOP). Without --redis a throwaway redis-server is started on a free port.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import torch
from store_throughput import redis_url

from vlcache.engine import Engine
from vlcache.entry import ImageEntry
from vlcache.models.synthetic import TINY, save_checkpoint
from vlcache.server import ServerConfig, create_app
from vlcache.server.local import serve_in_thread
from vlcache.stores import codec
from vlcache.stores.redis import RedisStore

BATCH = 2_000


def tiny_entry() -> ImageEntry:
    n = 2  # tokens: the count's cost is per manifest, not per byte
    return ImageEntry(embeds=torch.randn(n, 8), keys=torch.randn(1, n, 1, 8),
                      values=torch.randn(1, n, 1, 8), positions=torch.arange(3 * n).reshape(3, n))


def fill(store: RedisStore, count: int) -> float:
    """`count` entries under keys img-0..., pipelined; returns the seconds it took."""
    entry, client = tiny_entry(), store._client
    t = time.perf_counter()
    for start in range(0, count, BATCH):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(start + BATCH, count)):
            key = f"img-{i:064x}"
            blob = codec.encode(key, entry, store.model, store.kv_dtype)
            nonce = os.urandom(8).hex()
            pipe.set(store._chunk_keys(key, nonce, 1)[0], blob)
            pipe.set(store._manifest_key(key),
                     json.dumps({"nonce": nonce, "chunks": 1, "size": len(blob)}))
        pipe.execute()
    return time.perf_counter() - t


def serve(engine: Engine, config: ServerConfig):
    return serve_in_thread(create_app(engine, config))


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def ms(samples: list[float]) -> str:
    q = statistics.quantiles(samples, n=100, method="inclusive") if len(samples) > 1 \
        else samples * 99
    return (f"{statistics.median(samples) * 1e3:.1f} / {q[98] * 1e3:.1f} / "
            f"{max(samples) * 1e3:.1f} ms")


def gauge(http: httpx.Client, name: str) -> float:
    line = next(x for x in http.get("/metrics").text.splitlines()
                if x.startswith(name + " "))
    return float(line.split()[1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=200_000)
    p.add_argument("--scrapes", type=int, default=200)
    p.add_argument("--recount-interval", type=float, default=2.0,
                   help="the server's --store-recount-interval during the run (default 2 s, "
                        "so that recounts overlap the scrapes; the server's default is 30 s)")
    p.add_argument("--redis", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp, redis_url(args.redis) as url:
        if url is None:
            raise SystemExit("no redis-server installed and no --redis given")
        engine = Engine.from_pretrained(save_checkpoint(Path(tmp) / "m", TINY["qwen2_5_vl"]),
                                        store=f"{url}?timeout=2s")
        store = engine.store
        assert isinstance(store, RedisStore)
        store.clear()
        took = fill(store, args.entries)
        assert store.get(f"img-{0:064x}") is not None, "the filled entries must be readable"
        print(f"filled {args.entries:,} entries in {took:.1f} s (codec-encoded entries, "
              "pipelined SETs of chunk + manifest; the store's own layout)")
        exact = timed(lambda: store.nbytes, 3)
        recount = timed(store.recount, 3)
        rows = [("exact count, as each scrape did before (SCAN + MGET, store.nbytes)", ms(exact)),
                ("store.recount(), now in a background thread", ms(recount))]
        config = ServerConfig("tiny", store_recount_s=args.recount_interval)
        with serve(engine, config) as base, httpx.Client(base_url=base) as http:
            time.sleep(recount[0] + 0.5)
            entries = gauge(http, "vlcache_store_entries")
            scrapes = timed(lambda: http.get("/metrics"), args.scrapes)
            rows.append((f"/metrics, {args.scrapes} scrapes, recounts every "
                         f"{args.recount_interval:g} s", ms(scrapes)))
            if args.redis is None:  # only a server of our own is frozen
                rows += frozen(http, _redis_pid(url))
        store.clear()
    print(f"vlcache_store_entries on the first scrape: {entries:,.0f}")
    print("\n| what | median / p99 / max |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


def frozen(http: httpx.Client, pid: int) -> list[tuple[str, str]]:
    """Scrapes and health checks while Redis is stopped (SIGSTOP): the store's calls hang."""
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(0.5)  # a background recount is now stuck on the frozen server
        scrapes = timed(lambda: http.get("/metrics"), 50)
        health = timed(lambda: http.get("/health"), 50)
    finally:
        os.kill(pid, signal.SIGCONT)
    return [("/metrics, Redis frozen (SIGSTOP), 50 scrapes", ms(scrapes)),
            ("/health, Redis frozen, 50 calls", ms(health))]


def _redis_pid(url: str) -> int:
    import redis

    return int(redis.Redis.from_url(url).info("server")["process_id"])


if __name__ == "__main__":
    main()
