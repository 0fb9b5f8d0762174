import random
import time

import pytest
import torch

from vlcache.entry import ImageEntry
from vlcache.stores import open_store

SECONDS = 2.0  # per store, all four processes at once
KEYS = [f"img-shared{i}" for i in range(6)]


def _size(worker: int) -> int:
    return 40 + 300 * worker  # different sizes, so a torn entry cannot look whole


def _filled(worker: int, seq: int) -> ImageEntry:
    """Every float is one value naming its writer, so a reader can tell a torn entry."""
    n, value = _size(worker), float(worker * 100_000 + seq)
    return ImageEntry(
        embeds=torch.full((n, 16), value),  # [N, H]
        keys=torch.full((4, n, 2, 8), value),  # [L, N, kv_heads, head_dim]
        values=torch.full((4, n, 2, 8), value),
        positions=torch.arange(3 * n).reshape(3, n),
    )


def _whole(entry: ImageEntry) -> bool:
    value = float(entry.embeds[0, 0])
    n = _size(int(value) // 100_000)
    return (
        entry.num_tokens == n
        and all(bool((t == value).all()) for t in (entry.embeds, entry.keys, entry.values))
        and torch.equal(entry.positions, torch.arange(3 * n).reshape(3, n))
    )


def _hammer(say, address: str, worker: int, start_at: float) -> dict:
    store = open_store(address)
    rng = random.Random(worker)
    counts = {"puts": 0, "hits": 0, "torn": 0}
    time.sleep(max(0.0, start_at - time.time()))
    deadline = time.monotonic() + SECONDS
    seq = 0
    while time.monotonic() < deadline:
        key = rng.choice(KEYS)
        if rng.random() < 0.5:
            seq += 1
            store.put(key, _filled(worker, seq))
            counts["puts"] += 1
        elif (entry := store.get(key)) is not None:
            counts["hits"] += 1
            counts["torn"] += not _whole(entry)
    return {**counts, "stats": store.stats.as_dict()}


def _run(fork, address: str) -> list[dict]:
    start_at = time.time() + 0.2
    children = [fork(_hammer, address, w, start_at) for w in range(4)]
    return [c.result()[0] for c in children]


def _check(results: list[dict]) -> None:
    assert sum(r["torn"] for r in results) == 0
    assert sum(r["hits"] for r in results) > 10
    assert sum(r["stats"]["puts"] for r in results) > 10
    assert all(r["stats"]["errors"] == 0 for r in results)


def test_four_processes_on_one_directory(tmp_path, fork):
    # a cap of ~2 of the largest entries: evictions race with the reads and writes as well
    results = _run(fork, f"disk://{tmp_path}?max_bytes=1MB")
    _check(results)
    assert sum(r["stats"]["evictions"] for r in results) > 0
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_four_processes_on_one_redis(redis_url, fork):
    pytest.importorskip("redis")
    _check(_run(fork, f"{redis_url}?chunk_bytes=64KB"))
