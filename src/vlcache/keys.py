"""Content keys: what makes two images (and two models) the same for the cache."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import blake3
import numpy as np
import PIL
import torch
import transformers
from PIL import Image

_PREPROCESSING_CODE = (f"transformers {transformers.__version__}, pillow {PIL.__version__}, "
                       f"numpy {np.__version__}")
KEY_VERSION = "v2"  # v2: images keyed by their decoded RGB pixels (v1: preprocessed patches)


@dataclass(frozen=True)
class ModelFingerprint:
    """Architecture + weights identity, with a stable string form."""

    architecture: str
    weights: str  # full-length blake3 hex digest of the config and weight files (or state dict)

    def __str__(self) -> str:
        return f"{self.architecture}@{self.weights}"

    @classmethod
    def parse(cls, text: str) -> ModelFingerprint:
        arch, _, digest = text.partition("@")
        if not arch or not digest:
            raise ValueError(f"not a model fingerprint: {text!r}")
        return cls(arch, digest)


def fingerprint_directory(path: str | os.PathLike, architecture: str) -> ModelFingerprint:
    """Hash config.json and every weight file of a checkpoint directory (contents, full length)."""
    root = Path(path)
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    files = [root / "config.json"] + sorted(
        p for p in root.iterdir() if p.suffix in {".safetensors", ".bin", ".gguf"}
    )
    for f in files:
        h.update(f.name.encode() + b"\0")
        h.update_mmap(str(f))
    return ModelFingerprint(architecture, h.hexdigest())


def fingerprint_file(path: str | os.PathLike) -> str:
    """Full-length blake3 of one file's contents (e.g. a GGUF checkpoint)."""
    h = blake3.blake3(max_threads=blake3.blake3.AUTO)
    h.update_mmap(str(path))
    return h.hexdigest()


def fingerprint_module(model: torch.nn.Module, architecture: str) -> ModelFingerprint:
    """Hash a model's config and state dict (for models built in memory, e.g. in tests)."""
    h = blake3.blake3()
    config = getattr(model, "config", None)
    if config is not None:
        h.update(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        h.update(name.encode() + b"\0")
        h.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    return ModelFingerprint(architecture, h.hexdigest())


def image_key(
    image: Image.Image,  # decoded, RGB
    grid_thw: torch.Tensor,  # [3] the grid the processor gives it
    processor_settings: dict[str, object],
    model: ModelFingerprint,
    kv_dtype: torch.dtype,
) -> str:
    """Full-length blake3 over everything that shapes an image's cached tensors.

    The decoded pixels, the processor's settings and the code that applies them (transformers,
    Pillow and NumPy versions) determine the preprocessed patches a segment key covers (design
    §1), so a hit needs no preprocessing to find its entry (vlcache.engine.patches); a library
    upgrade that could resize differently gives new keys rather than entries made from other
    patches.
    """
    if image.mode != "RGB":
        raise ValueError(f"image_key takes RGB images, got mode {image.mode}")
    h = blake3.blake3()
    header = {
        "version": KEY_VERSION,
        "grid": [int(x) for x in grid_thw.tolist()],
        "processor": processor_settings,
        "model": str(model),
        "kv_dtype": str(kv_dtype),
        "size": list(image.size),
        "preprocessing_code": _PREPROCESSING_CODE,
    }
    h.update(json.dumps(header, sort_keys=True, default=str).encode())
    h.update(image.tobytes())
    return f"img-{h.hexdigest()}"


def segment_key(token_ids: list[int], model: ModelFingerprint, kv_dtype: torch.dtype) -> str:
    """Full-length blake3 over a text segment's token ids, the model and the KV dtype."""
    h = blake3.blake3()
    header = {"version": KEY_VERSION, "model": str(model), "kv_dtype": str(kv_dtype)}
    h.update(json.dumps(header, sort_keys=True).encode())
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return f"txt-{h.hexdigest()}"
