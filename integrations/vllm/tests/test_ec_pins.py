"""Verify-then-pin: what the scheduler reports as a hit reaches the worker, whatever happens to
the store in between."""

from __future__ import annotations

from pathlib import Path

import torch

from vlcache_vllm import EncoderCache, Pins

# a model fingerprint as the connector makes them (architecture@weights;dtype)
MODEL = "Qwen2_5_VLForConditionalGeneration@" + "ab" * 32 + ";dtype=float32"


def test_a_pinned_entry_survives_its_deletion(disk_address: str, output: torch.Tensor) -> None:
    EncoderCache.open(disk_address, MODEL).save("mm-1", output)
    pins = Pins(EncoderCache.open(disk_address, MODEL))
    assert pins.check("mm-1")
    for f in Path(disk_address.removeprefix("disk://")).glob("*.vlc"):
        f.unlink()  # evicted, expired or damaged after the check
    assert pins.want("mm-1")
    loads = pins.take()
    assert list(loads) == ["mm-1"] and torch.equal(loads["mm-1"], output)


def test_a_miss_is_not_pinned(disk_address: str) -> None:
    pins = Pins(EncoderCache.open(disk_address, MODEL))
    assert not pins.check("absent")
    assert not pins.want("absent")
    assert pins.take() == {}


def test_a_damaged_entry_is_never_reported(disk_address: str, output: torch.Tensor) -> None:
    EncoderCache.open(disk_address, MODEL).save("mm-1", output)
    [path] = Path(disk_address.removeprefix("disk://")).glob("*.vlc")
    path.write_bytes(path.read_bytes()[:-10])
    cache = EncoderCache.open(disk_address, MODEL)
    assert not Pins(cache).check("mm-1")
    assert cache.metrics.damaged == 1


def test_pins_last_one_step(disk_address: str, output: torch.Tensor) -> None:
    cache = EncoderCache.open(disk_address, MODEL)
    cache.save("a", output)
    cache.save("b", output)
    pins = Pins(cache)
    assert pins.check("a") and pins.check("b") and pins.check("a")
    assert cache.metrics.hits == 2  # a second check of a pinned item does not reload it
    pins.want("a")  # b was checked but its request was not scheduled this step
    assert list(pins.take()) == ["a"]
    assert pins.pinned_bytes == 0 and pins.take() == {}
