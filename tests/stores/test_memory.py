import pytest
import torch

from vlcache.stores import open_store
from vlcache.stores.memory import MemoryStore


def test_get_returns_what_was_put(entry, same):
    store = MemoryStore()
    assert store.get("img-a") is None
    store.put("img-a", entry)
    assert same(store.get("img-a"), entry)
    assert store.contains("img-a") and list(store.keys()) == ["img-a"]
    assert store.nbytes == entry.nbytes
    assert store.stats.hits == 1 and store.stats.misses == 1 and store.stats.puts == 1
    assert store.delete("img-a") and not store.delete("img-a") and store.nbytes == 0


def test_evicts_least_recently_used_by_bytes(make_entry):
    e = make_entry()
    store = MemoryStore(max_bytes=3 * e.nbytes)
    for k in "abc":
        store.put(f"img-{k}", make_entry())
    store.get("img-a")  # a is now the most recent: b goes first
    store.put("img-d", make_entry())
    assert sorted(store.keys()) == ["img-a", "img-c", "img-d"]
    assert store.stats.evictions == store.evictions == 1
    assert store.nbytes <= store.max_bytes


def test_entry_larger_than_budget_is_not_cached(entry):
    store = MemoryStore(max_bytes=entry.nbytes - 1)
    store.put("img-a", entry)
    assert store.get("img-a") is None and store.nbytes == 0


def test_kv_dtype_halves_the_kv(entry):
    store = open_store("memory://?max_bytes=1GB&kv_dtype=bf16")
    store.put("img-a", entry)
    got = store.get("img-a")
    assert got.keys.dtype == torch.bfloat16 and got.embeds.dtype == torch.float32
    kv = entry.keys.nbytes + entry.values.nbytes
    assert store.nbytes == entry.nbytes - kv // 2


def test_batched_calls(make_entry):
    store = MemoryStore()
    items = [(f"img-{i}", make_entry()) for i in range(3)]
    store.put_many(items)
    assert [e is not None for e in store.get_many(["img-0", "img-x", "img-2"])] == [
        True, False, True
    ]
    assert store.contains_many(["img-1", "img-x"]) == [True, False]
    assert store.delete_many(["img-0", "img-1", "img-x"]) == 2 and len(store) == 1


def test_address_options():
    assert open_store("memory://?max_bytes=2GiB").max_bytes == 2**31
    with pytest.raises(ValueError, match="unknown store option"):
        open_store("memory://?max_byte=2GB")
