"""KV entries of the reuse plugin in a vlcache store, and its settings; no vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vlcache_vllm.keys import EncoderKey
from vlcache_vllm.reuse.config import ReuseConfig
from vlcache_vllm.reuse.entries import KVEntries, KVKey, KVShape

SHAPE = KVShape(layers=3, kv_heads=2, head_dim=8, dtype=torch.float32)


def kv(n: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.randn(3, n, 2, 8), torch.randn(3, n, 2, 8),
            torch.arange(3 * n).reshape(3, n))


def test_keys_name_the_model_and_differ_from_encoder_keys() -> None:
    a = str(KVKey("h1", "m1"))
    assert a.startswith("kv-") and a == str(KVKey("h1", "m1"))
    assert a != str(KVKey("h1", "m2")) and a != str(KVKey("h2", "m1"))
    assert a[3:] != str(EncoderKey("h1", "m1"))[3:]
    with pytest.raises(ValueError):
        KVKey("", "m")


def test_saved_kv_loads_back(disk_address: str) -> None:
    entries = KVEntries.open(disk_address, "model-a")
    keys, values, positions = kv()
    assert entries.load("h", 5, SHAPE) is None
    assert entries.save("h", keys, values, positions)
    entry = KVEntries.open(disk_address, "model-a").load("h", 5, SHAPE)
    assert torch.equal(entry.keys, keys) and torch.equal(entry.values, values)
    assert torch.equal(entry.positions, positions)
    assert entries.counters()["saves"] == 1 and entries.counters()["misses"] == 1


def test_a_misfit_or_damaged_entry_is_a_miss(disk_address: str, tmp_path: Path) -> None:
    entries = KVEntries.open(disk_address, "model-a")
    entries.save("h", *kv())
    assert entries.load("h", 6, SHAPE) is None  # another token count
    assert entries.load("h", 5, KVShape(4, 2, 8, torch.float32)) is None
    assert entries.counters()["rejected"] == 2
    assert KVEntries.open(disk_address, "model-b").load("h", 5, SHAPE) is None  # other model
    for f in (tmp_path / "ec").glob("*.vlc"):
        blob = bytearray(f.read_bytes())
        blob[len(blob) // 2] ^= 1
        f.write_bytes(bytes(blob))
    assert entries.load("h", 5, SHAPE) is None


def test_settings_are_checked_at_start_up() -> None:
    config = ReuseConfig.from_additional({"vlcache": {"store": "disk:///tmp/x"}})
    assert config.policy == "static:0.05"
    with pytest.raises(ValueError, match="store"):
        ReuseConfig.from_additional({})
    with pytest.raises(ValueError, match="unknown"):
        ReuseConfig.from_additional({"vlcache": {"store": "disk:///x", "ratio": 1}})
    with pytest.raises(ValueError):
        ReuseConfig.from_additional({"vlcache": {"store": "disk:///x", "policy": "nope"}})
    with pytest.raises(ValueError, match="memory"):
        ReuseConfig.from_additional({"vlcache": {"store": "memory://"}})
