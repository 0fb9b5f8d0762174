"""Bytes per cached image token, and put/get throughput of each store on this machine.

    python benchmarks/store_throughput.py [--tokens 1024] [--repeats 5] [--redis URL]

Without --redis, a throwaway redis-server is started on a free loopback port if one is
installed. Disk reads are served from the page cache (nothing here drops it), so they measure
the read + checksum + deserialise path, not the device.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from vlcache.entry import ImageEntry
from vlcache.stores import Store, codec, kvdtype, open_store


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    hidden: int


SHAPES = [
    Shape("fixture (Qwen2.5-0.5B LM)", 24, 2, 64, 896),
    Shape("Qwen2.5-VL-7B", 28, 4, 128, 3584),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def make_entry(shape: Shape, n: int, dtype: torch.dtype) -> ImageEntry:
    kv = (shape.layers, n, shape.kv_heads, shape.head_dim)
    return ImageEntry(
        embeds=torch.randn(n, shape.hidden).to(dtype),  # [N, H]
        keys=torch.randn(kv).to(dtype),  # [L, N, kv_heads, head_dim]
        values=torch.randn(kv).to(dtype),
        positions=torch.arange(3 * n).reshape(3, n),  # [3, N]
    )


def bytes_per_token(n: int) -> None:
    print(f"\nBytes per cached image token (measured on a {n}-token image, header included)")
    print(f"{'config':28} {'dtype':12} {'embeds':>8} {'KV':>8} {'serialised':>11} "
          f"{'MB/1k tok':>10}")
    for shape in SHAPES:
        rows = [(name, dtype, None) for name, dtype in DTYPES.items()]
        if kvdtype.FP8 is not None:
            rows.append(("bf16+fp8 KV", torch.bfloat16, kvdtype.FP8))
        for name, dtype, kv_dtype in rows:
            entry = make_entry(shape, n, dtype)
            blob = codec.encode("img-" + "0" * 64, entry, "bench@0", kv_dtype)
            kv_size = torch.finfo(kv_dtype or dtype).bits // 8
            embeds = shape.hidden * entry.embeds.element_size()
            kv = 2 * shape.layers * shape.kv_heads * shape.head_dim * kv_size
            per_token = len(blob) / n
            print(f"{shape.name:28} {name:12} {embeds:8d} {kv:8d} {per_token:11.0f} "
                  f"{per_token * 1000 / 1e6:10.1f}")


def measure(store: Store, entry: ImageEntry, repeats: int) -> tuple[float, float, bool]:
    """Median seconds of a put and of a get (distinct keys), and whether every get hit."""
    puts, gets, hits = [], [], 0
    for i in range(repeats):
        t0 = time.perf_counter()
        store.put(f"img-bench{i}", entry)
        puts.append(time.perf_counter() - t0)
    for i in range(repeats):
        t0 = time.perf_counter()
        hits += store.get(f"img-bench{i}") is not None
        gets.append(time.perf_counter() - t0)
    store.clear()
    return statistics.median(puts), statistics.median(gets), hits == repeats


def rate(mb: float, seconds: float) -> str:
    # the memory store keeps references, it copies nothing: MB/s would be a meaningless number
    return "no copy" if seconds < 1e-4 else f"{mb / seconds:.0f}"


def throughput(stores: dict[str, Store], shape: Shape, n: int, repeats: int) -> None:
    entry = make_entry(shape, n, torch.bfloat16)
    mb = entry.nbytes / 1e6
    print(f"\nStore throughput: {shape.name}, {n}-token image in bf16 = {mb:.1f} MB "
          f"(median of {repeats})")
    print(f"{'store':34} {'put MB/s':>9} {'get MB/s':>9} {'put ms':>8} {'get ms':>8}")
    for name, store in stores.items():
        put, get, all_hit = measure(store, entry, repeats)
        if not all_hit:
            print(f"{name:34} (entries did not come back: see the warnings above)")
            continue
        print(f"{name:34} {rate(mb, put):>9} {rate(mb, get):>9} {put * 1e3:8.2f} {get * 1e3:8.2f}")


@contextmanager
def redis_url(url: str | None) -> Iterator[str | None]:
    """The given URL, or a throwaway local redis-server's, or None if there is neither."""
    binary = shutil.which("redis-server")
    if url or binary is None:
        yield url
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as workdir:
        proc = subprocess.Popen(
            [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
             "no", "--dir", workdir], stdout=subprocess.DEVNULL,
        )
        try:
            time.sleep(0.5)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024, help="image tokens per entry")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--redis", default=None, help="redis://host:port/db to measure")
    args = parser.parse_args()

    bytes_per_token(args.tokens)
    with tempfile.TemporaryDirectory() as tmp, redis_url(args.redis) as url:
        addresses = {
            "memory": "memory://?max_bytes=8GB",
            "disk": f"disk://{tmp}/disk?max_bytes=8GB",
            "disk kv_dtype=fp8": f"disk://{tmp}/fp8?max_bytes=8GB&kv_dtype=fp8",
            "memory+disk (get hits memory)": f"memory://?max_bytes=8GB+disk://{tmp}/tiered",
        }
        if url:
            addresses["redis"] = url
        else:
            print("\n(no redis-server installed and no --redis given: Redis not measured)")
        if kvdtype.FP8 is None:
            del addresses["disk kv_dtype=fp8"]
        stores = {name: open_store(address) for name, address in addresses.items()}
        for shape in SHAPES:
            throughput(stores, shape, args.tokens, args.repeats)
        for store in stores.values():
            store.close()


if __name__ == "__main__":
    main()
