"""`store.usage`: bytes and entries kept by each store on its own puts and deletes (no I/O to read
them), and `recount()` / `Recounter` bringing in what other processes did (issue 22)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from vlcache.stores import Store, StoreUsage, open_store
from vlcache.stores.recount import Recounter

MODEL = "qwen2@" + "22" * 32


@pytest.fixture(params=["memory", "disk", "redis"])
def address(request, tmp_path) -> str:
    if request.param == "memory":
        return "memory://"
    if request.param == "disk":
        return f"disk://{tmp_path}/cache"
    pytest.importorskip("redis")
    return f"{request.getfixturevalue('redis_url')}?chunk_bytes=1KB"


def _exact(store: Store) -> StoreUsage:
    return StoreUsage(store.nbytes, len(list(store.keys())))


def test_usage_follows_puts_overwrites_and_deletes(address, make_entry):
    store = open_store(address, model=MODEL)
    assert store.usage == StoreUsage() == _exact(store)
    store.put("img-a", make_entry())
    store.put("img-b", make_entry(n=20))
    assert store.usage == _exact(store) and store.usage.entries == 2
    store.put("img-a", make_entry(n=30))  # an overwrite replaces the old size
    assert store.usage == _exact(store) and store.usage.entries == 2
    assert store.delete("img-b") and not store.delete("img-b")
    assert store.usage == _exact(store) and store.usage.entries == 1
    assert store.recount() == _exact(store)


def test_usage_reads_nothing_from_the_backend(address, entry, monkeypatch):
    store = open_store(address, model=MODEL)
    store.put("img-a", entry)

    def forbidden(*_):
        raise AssertionError("usage touched the backend")

    for name in ("keys", "_files", "_call"):
        if hasattr(store, name):
            monkeypatch.setattr(store, name, forbidden)
    assert store.usage.entries == 1


@pytest.mark.parametrize("kind", ["disk", "redis"])
def test_recount_sees_another_process(kind, tmp_path, make_entry, request):
    if kind == "redis":
        pytest.importorskip("redis")
        address = request.getfixturevalue("redis_url")
    else:
        address = f"disk://{tmp_path}/shared"
    ours, theirs = open_store(address, model=MODEL), open_store(address, model=MODEL)
    ours.put("img-a", make_entry())
    theirs.put("img-b", make_entry(n=20))
    assert ours.usage.entries == 1  # not told about the other writer ...
    assert ours.recount() == _exact(ours) and ours.usage.entries == 2  # ... until a recount


def test_redis_down_keeps_the_last_count(spawn_redis, entry):
    pytest.importorskip("redis")
    server = spawn_redis()
    store = open_store(f"{server.url}?timeout=0.5s&retry=60s", model=MODEL)
    store.put("img-a", entry)
    counted = store.recount()
    server.stop()
    t = time.perf_counter()
    assert store.recount() == counted and store.usage == counted
    assert time.perf_counter() - t < 2.0


def test_tiered_usage_sums_its_tiers(tmp_path, entry):
    store = open_store(f"memory://+disk://{tmp_path}/t", model=MODEL)
    store.put("img-a", entry)
    tiers = store.tiers  # type: ignore[attr-defined]
    assert store.usage == tiers[0].usage + tiers[1].usage
    assert store.usage.entries == 2 and store.recount() == store.usage


def _wait(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def test_recounter_refreshes_in_the_background(tmp_path, make_entry):
    ours, theirs = (open_store(f"disk://{tmp_path}/r", model=MODEL) for _ in range(2))
    recounter = Recounter(ours, interval_s=0.05)
    recounter.start()
    try:
        theirs.put("img-a", make_entry())
        _wait(lambda: ours.usage.entries == 1)
        theirs.put("img-b", make_entry())
        _wait(lambda: ours.usage.entries == 2)
    finally:
        recounter.stop()
    assert not recounter._thread.is_alive()
    with pytest.raises(ValueError):
        Recounter(ours, interval_s=0)
