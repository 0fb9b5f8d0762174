import pytest
import torch

from vlcache.entry import ImageEntry
from vlcache.stores import codec, kvdtype

KEY = "img-" + "ab" * 32
MODEL = "qwen2@" + "cd" * 32


def test_roundtrip_keeps_every_tensor(entry, same):
    assert same(codec.decode(codec.encode(KEY, entry, MODEL), KEY, MODEL), entry)


def test_roundtrip_without_kv_or_positions():
    e = ImageEntry(embeds=torch.randn(5, 16).to(torch.bfloat16))
    got = codec.decode(codec.encode(KEY, e), KEY)
    assert got.keys is None and got.positions is None and torch.equal(got.embeds, e.embeds)


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp32"])
def test_kv_dtype_casts_kv_only(entry, name):
    dtype = kvdtype.KV_DTYPES[name]
    got = codec.decode(codec.encode(KEY, entry, kv_dtype=dtype), KEY, kv_dtype=dtype)
    assert got.keys.dtype == dtype and got.values.dtype == dtype
    assert torch.equal(got.keys, entry.keys.to(dtype))
    assert torch.equal(got.embeds, entry.embeds)  # the encoder output keeps its dtype


@pytest.mark.skipif(kvdtype.FP8 is None, reason="this torch build has no float8_e4m3fn")
def test_fp8_kv_is_scaled_per_layer_and_head_and_dequantised(make_entry):
    e = make_entry()
    e.keys[1, :, 0] *= 1000  # an outlier head: unscaled fp8 would saturate at 448
    got = codec.decode(codec.encode(KEY, e, kv_dtype=kvdtype.FP8), KEY, kv_dtype=kvdtype.FP8)
    assert got.keys.dtype == torch.float32
    rel = (got.keys - e.keys).abs().amax(dim=(1, 3)) / e.keys.abs().amax(dim=(1, 3))
    assert rel.max() < 0.07  # e4m3 keeps 3 mantissa bits


def test_every_truncation_is_corrupt(entry):
    blob = codec.encode(KEY, entry, MODEL)
    for n in [0, 5, 8, 40, 41, 100, len(blob) // 2, len(blob) - 1]:
        with pytest.raises(codec.CorruptEntry):
            codec.decode(blob[:n], KEY, MODEL)


def test_a_bit_flip_anywhere_is_rejected(entry):
    blob = codec.encode(KEY, entry, MODEL)
    # magic, format byte, digest, safetensors header (our metadata), tensor data, last byte
    for pos in [0, 7, 8, 20, 48, 120, len(blob) // 2, len(blob) - 1]:
        flipped = bytearray(blob)
        flipped[pos] ^= 0x10
        with pytest.raises(codec.BadEntry):
            codec.decode(bytes(flipped), KEY, MODEL)


def test_header_rejects_another_key_model_or_kv_dtype(entry):
    blob = codec.encode(KEY, entry, MODEL, kv_dtype=torch.bfloat16)
    assert codec.decode(blob, KEY, MODEL, torch.bfloat16) is not None
    with pytest.raises(codec.MismatchedEntry, match="key"):
        codec.decode(blob, "img-other", MODEL, torch.bfloat16)
    with pytest.raises(codec.MismatchedEntry, match="model"):
        codec.decode(blob, KEY, "qwen2@" + "00" * 32, torch.bfloat16)
    with pytest.raises(codec.MismatchedEntry, match="KV stored as"):
        codec.decode(blob, KEY, MODEL, torch.float16)


def test_future_format_is_rejected(entry):
    blob = bytearray(codec.encode(KEY, entry))
    blob[len(codec.MAGIC)] = codec.FORMAT + 1
    with pytest.raises(codec.MismatchedEntry, match="format"):
        codec.decode(bytes(blob), KEY)


def test_kv_dtype_names():
    assert kvdtype.parse_kv_dtype("BF16") is torch.bfloat16
    assert kvdtype.parse_kv_dtype("native") is None
    with pytest.raises(ValueError, match="unsupported KV dtype"):
        kvdtype.parse_kv_dtype("int4")


def test_roundtrip_keeps_a_resume_hidden_state(make_entry, same):
    e = make_entry()
    e = ImageEntry(**e.tensors(), hidden=torch.randn(e.num_tokens, 16),
                   hidden_layer=torch.tensor([2]))
    got = codec.decode(codec.encode(KEY, e, MODEL), KEY, MODEL)
    assert same(got, e) and got.resume_layer == 2


def test_a_hidden_state_needs_its_layer_and_the_kv():
    n = 4
    with pytest.raises(ValueError, match="layer"):
        ImageEntry(keys=torch.zeros(1, n, 1, 2), values=torch.zeros(1, n, 1, 2),
                   hidden=torch.zeros(n, 8))
    with pytest.raises(ValueError, match="KV"):
        ImageEntry(embeds=torch.zeros(n, 8), hidden=torch.zeros(n, 8),
                   hidden_layer=torch.tensor([1]))
