"""One entry <-> bytes, for stores that keep entries outside the process (disk, Redis).

Layout of a serialised entry:

    b"VLCACHE" + format byte | blake3 digest (32 bytes) | safetensors bytes

The safetensors part carries the tensors (names, dtypes, shapes) and, in its metadata, the
header: format version, image key, model fingerprint, KV dtype, token count. The digest covers
everything after it, header included, so a truncated or bit-flipped entry never decodes; the
header check rejects an entry written for another key, model or KV dtype.
"""

from __future__ import annotations

import json

import blake3
import torch
from safetensors.torch import load, save

from vlcache.entry import ImageEntry
from vlcache.stores import kvdtype

FORMAT = 1
MAGIC = b"VLCACHE"
_PREFIX = len(MAGIC) + 1 + 32


class BadEntry(Exception):
    """A stored entry that must not be used: `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CorruptEntry(BadEntry):
    """Truncated, bit-flipped or otherwise unreadable."""


class MismatchedEntry(BadEntry):
    """Intact, but written for another key, model, KV dtype or format version."""


def encode(
    key: str,
    entry: ImageEntry,
    model: str | None = None,
    kv_dtype: torch.dtype | None = None,
) -> bytes:
    tensors, meta = kvdtype.pack(entry, kv_dtype)
    header = {
        **meta,
        "format": str(FORMAT),
        "key": key,
        "model": model or "",
        "kv_dtype": kvdtype.kv_dtype_name(kv_dtype),
        "num_tokens": str(entry.num_tokens),
    }
    payload = save({n: t.detach().contiguous() for n, t in tensors.items()}, metadata=header)
    return b"".join((MAGIC, bytes([FORMAT]), blake3.blake3(payload).digest(), payload))


def decode(
    blob: bytes | memoryview,
    key: str,
    model: str | None = None,
    kv_dtype: torch.dtype | None = None,
) -> ImageEntry:
    """The entry in `blob`, or BadEntry. `model`/`kv_dtype` None accept whatever was written."""
    view = memoryview(blob)
    if len(view) < _PREFIX or bytes(view[: len(MAGIC)]) != MAGIC:
        raise CorruptEntry("truncated or not a vlcache entry")
    if view[len(MAGIC)] != FORMAT:
        raise MismatchedEntry(f"format version {view[len(MAGIC)]}, expected {FORMAT}")
    payload = view[_PREFIX:]
    if blake3.blake3(payload).digest() != bytes(view[len(MAGIC) + 1 : _PREFIX]):
        raise CorruptEntry("checksum mismatch")
    try:
        header = _metadata(payload)
        _check_header(header, key, model, kv_dtype)
        entry = kvdtype.unpack(load(bytes(payload)), header)
        if entry.num_tokens != int(header["num_tokens"]):
            raise CorruptEntry("token count does not match the header")
    except BadEntry:
        raise
    except Exception as e:  # the digest matched, so only a writer bug gets here; still a miss
        raise CorruptEntry(f"unreadable payload: {e}") from None
    return entry


def _check_header(
    header: dict[str, str], key: str, model: str | None, kv_dtype: torch.dtype | None
) -> None:
    if header.get("format") != str(FORMAT):
        raise MismatchedEntry(f"header format {header.get('format')!r}, expected {FORMAT}")
    if header.get("key") != key:
        raise MismatchedEntry(f"written for key {header.get('key')!r}")
    if model is not None and header.get("model") != model:
        raise MismatchedEntry(f"written for model {header.get('model')!r}, expected {model!r}")
    if kv_dtype is not None and header.get("kv_dtype") != kvdtype.kv_dtype_name(kv_dtype):
        raise MismatchedEntry(
            f"KV stored as {header.get('kv_dtype')!r}, expected {kvdtype.kv_dtype_name(kv_dtype)!r}"
        )


def _metadata(payload: memoryview) -> dict[str, str]:
    # the safetensors format: 8-byte little-endian header length, then a JSON header whose
    # "__metadata__" holds our string fields
    n = int.from_bytes(payload[:8], "little")
    return json.loads(bytes(payload[8 : 8 + n])).get("__metadata__", {})
