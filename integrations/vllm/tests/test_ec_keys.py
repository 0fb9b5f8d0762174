"""Store keys: vLLM's mm_hash and the model fingerprint, both."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vlcache_vllm import EncoderKey, model_fingerprint


def test_key_is_stable_and_names_both_parts() -> None:
    a = str(EncoderKey("hash-1", "model-a"))
    assert a == str(EncoderKey("hash-1", "model-a"))
    assert a != str(EncoderKey("hash-2", "model-a"))
    assert a != str(EncoderKey("hash-1", "model-b"))
    # a valid key for every store (the disk store's file names), whatever the mm_hash holds
    assert re.fullmatch(r"ec-[0-9a-f]{64}", str(EncoderKey("lora:x/y z", "m")))


@pytest.mark.parametrize("mm_hash,model", [("", "m"), ("h", "")])
def test_key_needs_both_parts(mm_hash: str, model: str) -> None:
    with pytest.raises(ValueError):
        EncoderKey(mm_hash, model)


def _checkpoint(root: Path, weight: float) -> Path:
    root.mkdir()
    (root / "config.json").write_text(json.dumps({"model_type": "qwen2_5_vl"}))
    save_file({"w": torch.full((4,), weight)}, str(root / "model.safetensors"))
    return root


def test_fingerprint_follows_the_weights_and_the_dtype(tmp_path: Path) -> None:
    arch = "Qwen2_5_VLForConditionalGeneration"
    a = model_fingerprint(_checkpoint(tmp_path / "a", 1.0), arch, "float32")
    same = model_fingerprint(_checkpoint(tmp_path / "same", 1.0), arch, "float32")
    other = model_fingerprint(_checkpoint(tmp_path / "b", 2.0), arch, "float32")
    assert a == same  # content, not the path
    assert a != other
    assert a != model_fingerprint(tmp_path / "a", arch, "bfloat16")
    assert a.startswith(f"{arch}@") and a.endswith(";dtype=float32")


def test_fingerprint_of_a_name_is_the_name(tmp_path: Path) -> None:
    fp = model_fingerprint("Qwen/Qwen2.5-VL-3B-Instruct", "Qwen2_5_VL", "bfloat16")
    assert fp == "Qwen2_5_VL@name:Qwen/Qwen2.5-VL-3B-Instruct;dtype=bfloat16"
