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


def default_device() -> str:
    """cuda when a GPU is visible, else cpu."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_dtype(device: str | torch.device) -> torch.dtype:
    """bfloat16 on CUDA (what its kernels are fast at), float32 on the CPU."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def check_device(device: str) -> str:
    """A device string torch understands and this machine has, or a ModelLoadError."""
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise ModelLoadError(f"unknown device {device!r}: use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ModelLoadError(f"device {device!r} asked for, but torch sees no CUDA GPU "
                                 f"(torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelLoadError(f"device {device!r}: only {torch.cuda.device_count()} "
                                 "GPU(s) visible")
    elif dev.type != "cpu":
        raise ModelLoadError(f"device {device!r} is not supported: use cpu, cuda or cuda:N")
    return str(dev)


def load_checkpoint(path: str | Path, dtype: torch.dtype = torch.float32,
                    device: str = "cpu") -> tuple[DecoderAdapter, object, object | None]:
    """-> (adapter, tokenizer, image_processor or None) for a local directory or .gguf file."""
    device = check_device(device)
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
