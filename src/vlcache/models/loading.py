"""Loading a local Hugging Face checkpoint directory: model, tokenizer, image processor."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vlcache.keys import fingerprint_directory
from vlcache.models.adapter import SUPPORTED_ARCHITECTURES, QwenVLAdapter


class ModelLoadError(ValueError):
    """The path is not a checkpoint vlcache can serve."""


def read_architecture(path: Path) -> str:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path} is not a model checkpoint directory (no config.json); "
                             "pass the local directory of a Hugging Face checkpoint")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{config_file} is not valid JSON: {e}") from None
    if model_type not in SUPPORTED_ARCHITECTURES:
        supported = ", ".join(sorted(SUPPORTED_ARCHITECTURES))
        raise ModelLoadError(f"{path}: architecture {model_type!r} is not supported "
                             f"(vlcache serves {supported})")
    return model_type


def load_image_processor(path: Path):
    """The slow (PIL) image processor works without torchvision; fall back to AutoProcessor."""
    from transformers import AutoImageProcessor, AutoProcessor

    try:
        return AutoImageProcessor.from_pretrained(path, backend="pil")
    except (OSError, ValueError, ImportError):
        return AutoProcessor.from_pretrained(path).image_processor


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str = "cpu"):
    """-> (adapter, tokenizer, image_processor) for a local checkpoint directory."""
    import transformers
    from transformers import AutoTokenizer

    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    arch = read_architecture(path)
    cls = getattr(transformers, SUPPORTED_ARCHITECTURES[arch])
    model = cls.from_pretrained(path, dtype=dtype).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    processor = load_image_processor(path)
    return QwenVLAdapter(model, fingerprint_directory(path, arch)), tokenizer, processor
