import logging
import time

import pytest

from vlcache.stores import open_store
from vlcache.stores.redis import CHUNK_TTL_MARGIN_S, GRACE_S, RedisStore

redis = pytest.importorskip("redis")
MODEL = "qwen2@" + "11" * 32


@pytest.fixture
def client(redis_url):
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def _chunks(client, key: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"vlcache:c:{key}:*"))


def test_roundtrip_in_chunks(redis_url, client, entry, same):
    store = open_store(f"{redis_url}?chunk_bytes=1KB", model=MODEL)
    store.put("img-a", entry)
    assert len(_chunks(client, "img-a")) > 3  # entry.nbytes is a few KB
    other = open_store(f"{redis_url}?chunk_bytes=1KB", model=MODEL)  # another engine process
    assert same(other.get("img-a"), entry) and other.contains("img-a")
    assert list(other.keys()) == ["img-a"] and other.nbytes > entry.nbytes
    assert other.stats.hits == 1 and other.stats.bytes_read == store.stats.bytes_written
    assert other.delete("img-a") and not other.contains("img-a") and _chunks(client, "img-a") == []


def test_ttl_on_manifest_and_longer_on_chunks(redis_url, client, entry):
    store = open_store(f"{redis_url}?ttl=1h&chunk_bytes=1KB")
    store.put("img-a", entry)
    assert 3590 < client.ttl("vlcache:e:img-a") <= 3600
    assert all(
        client.ttl(c) > 3600 + CHUNK_TTL_MARGIN_S - 10 for c in _chunks(client, "img-a")
    )


def test_overwrite_retires_the_old_chunks(redis_url, client, make_entry, same):
    store = RedisStore(redis_url, chunk_bytes=1024)
    store.put("img-a", make_entry())
    old = _chunks(client, "img-a")
    new_entry = make_entry()
    store.put("img-a", new_entry)
    assert same(store.get("img-a"), new_entry)
    assert all(0 < client.ttl(c) <= GRACE_S for c in old)  # readers mid-flight can finish


def _truncate(client, chunk):
    client.set(chunk, client.get(chunk)[:-7])


def _bitflip(client, chunk):
    data = bytearray(client.get(chunk))
    data[len(data) // 2] ^= 0x04
    client.set(chunk, bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _bitflip, lambda c, k: c.delete(k)],
                         ids=["truncated", "bitflip", "evicted-chunk"])
def test_damaged_entry_is_a_miss_and_removed(redis_url, client, make_entry, caplog, damage):
    caplog.set_level(logging.DEBUG, logger="vlcache.stores")
    store = RedisStore(redis_url, chunk_bytes=1024)
    for k in ("img-a", "img-b"):
        store.put(k, make_entry())
        damage(client, _chunks(client, k)[1])
    assert store.get("img-a") is None and store.get("img-b") is None
    assert client.dbsize() == 0  # manifests and chunks removed
    assert store.stats.corrupt == 2
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    store.put("img-a", make_entry())
    assert store.get("img-a") is not None


def test_entry_of_another_model_is_rejected(redis_url, client, entry):
    open_store(redis_url, model=MODEL).put("img-a", entry)
    other = open_store(redis_url, model="qwen2@" + "22" * 32)
    assert other.get("img-a") is None and other.stats.corrupt == 1 and client.dbsize() == 0


def _stalled_put(say, url: str, entry) -> None:
    def stall(self, r, key, manifest) -> None:
        say("stalled")
        time.sleep(600)

    RedisStore._publish = stall  # in the child only: chunks are in, the manifest never comes
    RedisStore(url, chunk_bytes=4096).put("img-k2", entry)


def test_kill_mid_put_leaves_no_entry(redis_url, client, make_entry, same, fork):
    old = make_entry()
    RedisStore(redis_url).put("img-k", old)
    child = fork(_stalled_put, redis_url, make_entry(n=500))
    assert child.recv() == "stalled"
    child.kill()
    assert _chunks(client, "img-k2")  # it died between the chunks and the manifest
    store = RedisStore(redis_url)
    assert store.get("img-k2") is None and list(store.keys()) == ["img-k"]
    assert same(store.get("img-k"), old)


def test_unreachable_at_start_then_reconnects(spawn_redis, entry, caplog):
    caplog.set_level(logging.INFO, logger="vlcache.stores")
    server = spawn_redis()
    server.stop()  # a free port with nobody listening
    store = RedisStore(server.url, retry=0.3, timeout=0.5)
    t0 = time.monotonic()
    store.put("img-a", entry)
    assert store.get("img-a") is None and not store.contains("img-a")
    assert time.monotonic() - t0 < 2
    assert store.stats.errors == 1 and store.stats.unavailable == 2 and not store.available
    assert "unreachable" in caplog.text
    server.start()
    time.sleep(0.35)
    store.put("img-a", entry)
    assert store.get("img-a") is not None and store.available
    assert "reachable again" in caplog.text
