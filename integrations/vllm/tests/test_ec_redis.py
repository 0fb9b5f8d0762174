"""The encoder cache over Redis (a real redis-server) and over tiers."""

from __future__ import annotations

import torch

from vlcache_vllm import EncoderCache

# two model fingerprints as the connector makes them (architecture@weights;dtype)
MODEL = "Qwen2_5_VLForConditionalGeneration@" + "ab" * 32 + ";dtype=float32"
OTHER_MODEL = "Qwen2_5_VLForConditionalGeneration@" + "cd" * 32 + ";dtype=float32"


def test_round_trip_through_redis(redis_url: str, output: torch.Tensor) -> None:
    assert EncoderCache.open(redis_url, MODEL).save("mm-1", output)
    reader = EncoderCache.open(redis_url, MODEL)
    assert torch.equal(reader.load("mm-1"), output)
    assert EncoderCache.open(redis_url, OTHER_MODEL).load("mm-1") is None


def test_a_bit_flip_in_redis_is_a_counted_miss(redis_url: str, output: torch.Tensor) -> None:
    import redis

    EncoderCache.open(redis_url, MODEL).save("mm-1", output)
    client = redis.Redis.from_url(redis_url)
    [chunk] = [k for k in client.keys("vlcache:c:*")]
    blob = bytearray(client.get(chunk))
    blob[len(blob) // 2] ^= 0x10
    client.set(chunk, bytes(blob), keepttl=True)
    cache = EncoderCache.open(redis_url, MODEL)
    assert cache.load("mm-1") is None
    assert cache.metrics.damaged == 1 and cache.metrics.misses == 1
    client.close()


def test_tiers_disk_and_redis(redis_url: str, tmp_path, output: torch.Tensor) -> None:
    address = f"disk://{tmp_path / 'ec'}+{redis_url}"
    EncoderCache.open(address, MODEL).save("mm-1", output)
    # another machine: its own disk tier, the same Redis
    other = EncoderCache.open(f"disk://{tmp_path / 'ec2'}+{redis_url}", MODEL)
    assert torch.equal(other.load("mm-1"), output)
    assert list((tmp_path / "ec2").glob("*.vlc"))  # promoted into the faster tier
