"""Loading a local checkpoint: a Hugging Face directory, or a GGUF file for text-only models."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from vlcache.keys import ModelFingerprint, fingerprint_directory, fingerprint_file
from vlcache.models.adapter import (
    SUPPORTED_ARCHITECTURES,
    TEXT_ARCHITECTURES,
    DecoderAdapter,
    QwenVLAdapter,
    TextAdapter,
)


class ModelLoadError(ValueError):
    """The path is not a checkpoint vlcache can serve."""


def _supported() -> str:
    return ", ".join(sorted(SUPPORTED_ARCHITECTURES | TEXT_ARCHITECTURES))


def read_architecture(path: Path) -> str:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelLoadError(f"{path} is not a model checkpoint directory (no config.json); "
                             "pass the local directory of a Hugging Face checkpoint "
                             "or a .gguf file")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{config_file} is not valid JSON: {e}") from None
    if model_type not in SUPPORTED_ARCHITECTURES and model_type not in TEXT_ARCHITECTURES:
        raise ModelLoadError(f"{path}: architecture {model_type!r} is not supported "
                             f"(vlcache serves {_supported()})")
    return model_type


def load_image_processor(path: Path):
    """The slow (PIL) image processor works without torchvision; fall back to AutoProcessor."""
    from transformers import AutoImageProcessor, AutoProcessor

    try:
        return AutoImageProcessor.from_pretrained(path, backend="pil")
    except (OSError, ValueError, ImportError, TypeError):
        return AutoProcessor.from_pretrained(path).image_processor


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str = "cpu") -> tuple[DecoderAdapter, object, object | None]:
    """-> (adapter, tokenizer, image_processor or None) for a local directory or .gguf file."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model path {path} does not exist")
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf(path, dtype, device)
    arch = read_architecture(path)
    import transformers
    from transformers import AutoTokenizer

    fingerprint = fingerprint_directory(path, arch)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if arch in TEXT_ARCHITECTURES:
        model = getattr(transformers, TEXT_ARCHITECTURES[arch]).from_pretrained(path, dtype=dtype)
        return TextAdapter(model.to(device).eval(), fingerprint), tokenizer, None
    model = getattr(transformers, SUPPORTED_ARCHITECTURES[arch]).from_pretrained(path, dtype=dtype)
    adapter = QwenVLAdapter(model.to(device).eval(), fingerprint)
    return adapter, tokenizer, load_image_processor(path)


def _load_gguf(path: Path, dtype: torch.dtype, device: str):
    """A text-only model from a GGUF file (de-quantised by transformers on load)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    arch = model.config.model_type
    if arch not in TEXT_ARCHITECTURES:
        raise ModelLoadError(f"{path}: GGUF architecture {arch!r} is not supported "
                             f"(text models: {', '.join(sorted(TEXT_ARCHITECTURES))})")
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    fingerprint = ModelFingerprint(arch, fingerprint_file(path))
    return TextAdapter(model.to(device).eval(), fingerprint), tokenizer, None
