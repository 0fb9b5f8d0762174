"""The store-backed encoder cache without vLLM: round trips between processes' stores,
keying, damaged entries as counted misses, the addresses it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vlcache.stores import open_store
from vlcache.stores.memory import MemoryStore
from vlcache_vllm import EncoderCache, Expected, check_shared
from vlcache_vllm.settings import Settings

# two model fingerprints as the connector makes them (architecture@weights;dtype)
MODEL = "Qwen2_5_VLForConditionalGeneration@" + "ab" * 32 + ";dtype=float32"
OTHER_MODEL = "Qwen2_5_VLForConditionalGeneration@" + "cd" * 32 + ";dtype=float32"


def entry_files(address: str) -> list[Path]:
    return sorted(Path(address.removeprefix("disk://")).glob("*.vlc"))


def test_round_trip_between_two_stores(disk_address: str, output: torch.Tensor) -> None:
    writer = EncoderCache.open(disk_address, MODEL)  # one vLLM process's worker
    assert writer.save("mm-1", output)
    reader = EncoderCache.open(disk_address, MODEL)  # another process's scheduler
    loaded = reader.load("mm-1")
    assert loaded is not None and torch.equal(loaded, output)
    assert reader.metrics.hits == 1 and reader.metrics.misses == 0
    assert reader.metrics.bytes_loaded == output.numel() * 4
    assert writer.metrics.saves == 1 and writer.metrics.bytes_saved == output.numel() * 4
    assert reader.metrics.load_seconds > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_whatever_vllm_hands_over_comes_back(disk_address: str, dtype: torch.dtype) -> None:
    # Qwen3-VL: the LM width and three deepstack levels on the last dimension
    wide = torch.randn(10, 4 * 32).to(dtype)
    EncoderCache.open(disk_address, MODEL).save("mm-wide", wide)
    expected = Expected(dtype, frozenset({128}))
    loaded = EncoderCache.open(disk_address, MODEL).load("mm-wide", expected)
    assert loaded is not None and loaded.dtype == dtype and torch.equal(loaded, wide)


def test_another_models_entry_is_a_miss(disk_address: str, output: torch.Tensor) -> None:
    EncoderCache.open(disk_address, MODEL).save("mm-1", output)
    other = EncoderCache.open(disk_address, OTHER_MODEL)
    assert other.load("mm-1") is None
    assert other.metrics.misses == 1 and other.metrics.damaged == 0  # another key: not damaged
    assert other.load("mm-2") is None


def test_an_entry_under_the_right_key_but_for_another_model_is_damaged(
    disk_address: str, output: torch.Tensor
) -> None:
    # the header check behind the key: a file renamed into place for another model
    EncoderCache.open(disk_address, OTHER_MODEL).save("mm-1", output)
    cache = EncoderCache.open(disk_address, MODEL)
    [src] = entry_files(disk_address)
    src.rename(src.with_name(cache.key("mm-1") + ".vlc"))
    assert cache.load("mm-1") is None
    assert cache.metrics.damaged == 1


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("damage", [_truncate, _flip], ids=["truncated", "bit-flipped"])
def test_a_damaged_entry_is_a_counted_miss(disk_address: str, output: torch.Tensor,
                                           damage) -> None:
    EncoderCache.open(disk_address, MODEL).save("mm-1", output)
    [path] = entry_files(disk_address)
    damage(path)
    cache = EncoderCache.open(disk_address, MODEL)
    assert cache.load("mm-1") is None  # never an exception
    assert cache.metrics.damaged == 1 and cache.metrics.misses == 1 and cache.metrics.hits == 0
    assert entry_files(disk_address) == []  # removed, so the next save replaces it
    cache.save("mm-1", output)
    assert torch.equal(cache.load("mm-1"), output)


def test_an_entry_that_does_not_fit_the_model_is_a_rejected_miss(
    disk_address: str, output: torch.Tensor
) -> None:
    cache = EncoderCache.open(disk_address, MODEL)
    cache.save("mm-1", output)  # [64, 96] float32
    assert cache.load("mm-1", Expected(torch.bfloat16)) is None
    assert cache.load("mm-1", Expected(torch.float32, frozenset({128}))) is None
    assert cache.metrics.rejected == 2 and cache.metrics.misses == 2
    assert torch.equal(cache.load("mm-1", Expected(torch.float32, frozenset({96}))), output)


class _Broken(MemoryStore):
    def get(self, key):
        raise RuntimeError("backend bug")

    def put(self, key, entry):
        raise OSError("disk full")


def test_a_failing_store_gives_misses_and_skipped_saves(output: torch.Tensor) -> None:
    cache = EncoderCache(_Broken(), MODEL)
    assert cache.save("mm-1", output) is False
    assert cache.load("mm-1") is None
    assert cache.metrics.errors == 2 and cache.metrics.misses == 1 and cache.metrics.saves == 0


@pytest.mark.parametrize("address", ["memory://", "memory://?max_bytes=1GB"])
def test_an_in_process_store_is_refused(address: str) -> None:
    with pytest.raises(ValueError, match="separate processes"):
        EncoderCache.open(address, MODEL)
    with pytest.raises(ValueError, match="separate processes"):
        Settings.from_extra({"store": address})


def test_a_memory_tier_in_front_of_a_shared_store_is_allowed(tmp_path: Path,
                                                            output: torch.Tensor) -> None:
    address = f"memory://+disk://{tmp_path / 'ec'}"
    check_shared(address)
    EncoderCache.open(address, MODEL).save("mm-1", output)
    assert torch.equal(EncoderCache.open(f"disk://{tmp_path / 'ec'}", MODEL).load("mm-1"),
                       output)


def test_settings_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="needs \"store\""):
        Settings.from_extra({})
    with pytest.raises(ValueError, match="unknown ec_connector_extra_config keys"):
        Settings.from_extra({"store": "disk:///tmp/x", "shared_storage_path": "/tmp"})
    with pytest.raises(ValueError, match="unknown store address"):
        EncoderCache.open("s3://bucket", MODEL)
    s = Settings.from_extra({"store": "disk:///tmp/x", "model_fingerprint": "m@1"})
    assert s.model_fingerprint == "m@1"


def test_the_store_checks_the_model_header(disk_address: str) -> None:
    # EncoderCache.open passes the fingerprint to the store, which writes it into each header
    cache = EncoderCache.open(disk_address, MODEL)
    assert cache.store.model == MODEL
    assert open_store(disk_address, model=MODEL).model == MODEL
