import subprocess
import sys

import pytest

from vlcache.stores import open_store
from vlcache.stores.address import parse_bytes, parse_duration, split_tiers
from vlcache.stores.disk import DiskStore
from vlcache.stores.memory import MemoryStore
from vlcache.stores.tiered import TieredStore


def test_sizes_and_durations():
    assert parse_bytes("512MB") == 512 * 10**6 and parse_bytes("1_000") == 1000
    assert parse_duration("15m") == 900 and parse_duration("7d") == 7 * 86400
    for bad in ["", "MB", "12XB"]:
        with pytest.raises(ValueError):
            parse_bytes(bad)


def test_default_and_unknown_scheme():
    assert isinstance(open_store(None), MemoryStore)
    with pytest.raises(ValueError, match="expected one of"):
        open_store("s3://bucket")


def test_tiers_split_only_before_a_scheme(tmp_path):
    odd = tmp_path / "a+b"  # a '+' in a path is not a tier separator
    address = f"memory://?max_bytes=1MB+disk://{odd}?max_bytes=1GB"
    assert split_tiers(address) == ["memory://?max_bytes=1MB", f"disk://{odd}?max_bytes=1GB"]
    store = open_store(address, model="qwen2@00")
    assert isinstance(store, TieredStore)
    assert isinstance(store.back, DiskStore) and store.back.root == odd
    assert store.back.model == "qwen2@00"


def test_disk_address(tmp_path):
    store = open_store(f"disk://{tmp_path}/c?max_bytes=3GB&kv_dtype=fp16&fsync=1")
    assert store.root == tmp_path / "c" and store.max_bytes == 3 * 10**9 and store.fsync
    assert open_store(store.address).max_bytes == store.max_bytes  # the address round-trips


def test_redis_address_keeps_credentials_out_of_the_public_form():
    pytest.importorskip("redis")
    store = open_store("redis://user:secret@127.0.0.1:1/2?ttl=1h&chunk_bytes=1MB&retry=5")
    assert store.ttl == 3600 and store.chunk_bytes == 10**6 and store.retry == 5
    assert "secret" not in store.address and store.address.startswith("redis://127.0.0.1:1/2")
    store.close()


def test_core_does_not_import_redis():
    code = "import sys, vlcache.stores; vlcache.stores.open_store('memory://'); " \
           "print('redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
