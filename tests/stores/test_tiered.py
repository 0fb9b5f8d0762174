import logging
import time

import pytest

from vlcache.stores import open_store
from vlcache.stores.disk import DiskStore
from vlcache.stores.memory import MemoryStore
from vlcache.stores.tiered import TieredStore


def test_read_through_promotes_and_writes_go_through(tmp_path, entry, same):
    store = open_store(f"memory://?max_bytes=1MB+disk://{tmp_path}")
    assert isinstance(store.front, MemoryStore) and isinstance(store.back, DiskStore)
    store.put("img-a", entry)
    assert store.front.contains("img-a") and store.back.contains("img-a")
    store.front.clear()
    assert same(store.get("img-a"), entry)  # from disk ...
    assert store.front.contains("img-a")  # ... and now in memory too
    assert store.get("img-a") is not None
    assert store.front.stats.hits == 1 and store.back.stats.hits == 1 and store.stats.hits == 2
    assert store.delete("img-a") and not store.contains("img-a") and store.get("img-a") is None


def test_three_tiers_promote_into_every_faster_one(tmp_path, entry):
    tiers = [MemoryStore(), DiskStore(tmp_path / "fast"), DiskStore(tmp_path / "slow")]
    store = TieredStore(tiers)
    tiers[2].put("img-a", entry)
    assert store.get("img-a") is not None
    assert all(t.contains("img-a") for t in tiers) and list(store.keys()) == ["img-a"]


def test_tiers_must_agree_on_kv_dtype(tmp_path):
    with pytest.raises(ValueError, match="same kv_dtype"):
        open_store(f"memory://+disk://{tmp_path}?kv_dtype=bf16")
    store = open_store(f"memory://?kv_dtype=bf16+disk://{tmp_path}?kv_dtype=bf16")
    assert str(store.kv_dtype) == "torch.bfloat16"


def test_redis_killed_mid_run_memory_keeps_serving_then_reconnects(
    spawn_redis, make_entry, caplog, same
):
    pytest.importorskip("redis")
    caplog.set_level(logging.INFO, logger="vlcache.stores")
    server = spawn_redis()
    store = open_store(f"memory://+{server.url}?retry=0.2&timeout=0.5")
    redis_tier = store.back
    a, b = make_entry(), make_entry()
    store.put("img-a", a)
    assert redis_tier.contains("img-a")

    server.stop()
    assert same(store.get("img-a"), a)  # the memory tier answers
    store.put("img-b", b)  # memory takes it; the Redis put is a logged no-op
    assert same(store.get("img-b"), b)
    assert store.get("img-c") is None  # a miss everywhere, no exception
    assert redis_tier.stats.errors >= 1 and not redis_tier.available
    assert store.stats.errors == redis_tier.stats.errors  # what the metrics exporter reads
    assert "unreachable" in caplog.text

    server.start()  # same port, empty
    time.sleep(0.25)
    store.put("img-b", b)
    assert redis_tier.available and redis_tier.contains("img-b")
    assert "reachable again" in caplog.text
