"""What an encoder output is stored under: vLLM's mm_hash and the model that encoded it."""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import blake3

from vlcache.keys import ModelFingerprint, fingerprint_directory

KEY_VERSION = "ec1"
PREFIX = "ec-"  # apart from vlcache's own "img-" / "txt-" keys, so one store can hold both


@dataclass(frozen=True)
class EncoderKey:
    """One encoder output: vLLM's mm_hash (the item, its processor kwargs and the model path,
    or a caller's UUID) and the model fingerprint (weights, architecture, dtype).

    The mm_hash alone is not enough: a caller-supplied UUID names the item, not the model,
    and two checkpoints at the same path are different models. The store key is a full blake3
    over both, so it is a valid key for every store whatever characters the mm_hash holds.
    Subclasses key other things of the same item (their own prefix and version).
    """

    mm_hash: str
    model: str

    PREFIX = PREFIX
    VERSION = KEY_VERSION
    WHAT = "an encoder key"

    def __post_init__(self) -> None:
        if not self.mm_hash:
            raise ValueError(f"{self.WHAT} needs vLLM's mm_hash")
        if not self.model:
            raise ValueError(f"{self.WHAT} needs a model fingerprint")

    def __str__(self) -> str:
        header = {"version": self.VERSION, "mm_hash": self.mm_hash, "model": self.model}
        return self.PREFIX + blake3.blake3(json.dumps(header, sort_keys=True).encode()).hexdigest()


def model_fingerprint(model: str | os.PathLike, architecture: str, dtype: str) -> str:
    """The fingerprint of the model whose encoder outputs a store holds.

    A checkpoint directory is hashed by content (config and weight files, vlcache's
    `fingerprint_directory`); anything else (a hub name) by its name only, which is weaker: the
    same name with other weights would share entries. `dtype` is the dtype the model runs in
    (an encoder output computed in bf16 is not the fp32 one).
    """
    path = Path(model).expanduser()
    if path.is_dir():
        fingerprint = _directory_fingerprint(str(path.resolve()), architecture)
    else:
        fingerprint = ModelFingerprint(architecture, f"name:{model}")
    return f"{fingerprint};dtype={dtype}"


@functools.lru_cache(maxsize=8)
def _directory_fingerprint(path: str, architecture: str) -> ModelFingerprint:
    # hashing a checkpoint reads every weight file: once per process and directory
    return fingerprint_directory(path, architecture)
