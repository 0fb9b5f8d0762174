"""Random-weight checkpoints of the real architectures, for tests and timing.

Timing does not depend on weight values, so a random model of a real size is honest for speed;
quality needs trained weights (the fixture, fixture/README.md). The tokenizer is byte-level with
the Qwen special tokens, so prompts of any text work without a downloaded vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                  "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class SyntheticSpec:
    """The sizes that matter for a Qwen-VL checkpoint; `arch` is the HF model_type."""

    arch: str  # qwen2_vl | qwen2_5_vl | qwen3_vl
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vision_hidden: int
    vision_depth: int
    vision_heads: int
    vision_intermediate: int
    head_dim: int | None = None


TINY = {
    "qwen2_vl": SyntheticSpec("qwen2_vl", 64, 4, 4, 2, 128, 32, 2, 2, 64),
    "qwen2_5_vl": SyntheticSpec("qwen2_5_vl", 64, 4, 4, 2, 128, 32, 2, 2, 64),
    "qwen3_vl": SyntheticSpec("qwen3_vl", 64, 4, 4, 2, 128, 32, 3, 2, 64, head_dim=16),
}

TEXT_ARCHS = ("qwen2", "qwen3", "llama")
TINY_TEXT = {a: SyntheticSpec(a, 64, 4, 4, 2, 128, 0, 0, 0, 0, head_dim=16) for a in TEXT_ARCHS}

# Real sizes (language model and vision tower as published), random weights.
SIZES = {
    "qwen2_5_vl-3b": SyntheticSpec("qwen2_5_vl", 2048, 36, 16, 2, 11008, 1280, 32, 16, 3420),
    "qwen2_5_vl-7b": SyntheticSpec("qwen2_5_vl", 3584, 28, 28, 4, 18944, 1280, 32, 16, 3420),
    "qwen2_vl-2b": SyntheticSpec("qwen2_vl", 1536, 28, 12, 2, 8960, 1280, 32, 16, 5120),
    "qwen3_vl-4b": SyntheticSpec("qwen3_vl", 2560, 36, 32, 8, 9728, 1024, 24, 16, 4096,
                                 head_dim=128),
    "qwen3_vl-8b": SyntheticSpec("qwen3_vl", 4096, 36, 32, 8, 12288, 1152, 27, 16, 4304,
                                 head_dim=128),
    "qwen2-0.5b": SyntheticSpec("qwen2", 896, 24, 14, 2, 4864, 0, 0, 0, 0),
    **{f"tiny-{k}": v for k, v in (TINY | TINY_TEXT).items()},
}


def build_tokenizer():
    """A byte-level BPE tokenizer (no merges) with the Qwen special tokens and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=CHATML_TEMPLATE,
    )


def _config(spec: SyntheticSpec, tokenizer, vocab_size: int):
    from transformers import Qwen2_5_VLConfig, Qwen2VLConfig, Qwen3VLConfig

    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in [
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>")]}
    head_dim = spec.head_dim or spec.hidden // spec.heads
    half = head_dim // 2
    text = dict(vocab_size=vocab_size, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
                num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
                intermediate_size=spec.intermediate, max_position_embeddings=32768,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                bos_token_id=None)
    if spec.arch == "qwen3_vl":
        s = half * 5 // 16  # [24, 20, 20] at head_dim 128, as published
        sections = [half - 2 * s, s, s]
        text.update(head_dim=head_dim, rope_parameters={
            "rope_type": "default", "rope_theta": 5e6, "mrope_section": sections,
            "mrope_interleaved": True})
        vision = dict(hidden_size=spec.vision_hidden, depth=spec.vision_depth,
                      num_heads=spec.vision_heads, intermediate_size=spec.vision_intermediate,
                      out_hidden_size=spec.hidden, patch_size=16, num_position_embeddings=144,
                      deepstack_visual_indexes=list(range(min(3, spec.vision_depth))))
        return Qwen3VLConfig(text_config=text, vision_config=vision, **ids)
    s = half * 3 // 8  # [16, 24, 24] at head_dim 128, as published
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6,
                               "mrope_section": [half - 2 * s, s, s]}
    if spec.arch == "qwen2_5_vl":
        vision = dict(hidden_size=spec.vision_hidden, depth=spec.vision_depth,
                      num_heads=spec.vision_heads, intermediate_size=spec.vision_intermediate,
                      out_hidden_size=spec.hidden,
                      fullatt_block_indexes=[spec.vision_depth - 1])
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, **ids)
    vision = dict(embed_dim=spec.vision_hidden, depth=spec.vision_depth,
                  num_heads=spec.vision_heads, mlp_ratio=spec.vision_intermediate
                  // spec.vision_hidden, hidden_size=spec.hidden)
    return Qwen2VLConfig(text_config=text, vision_config=vision, **ids)


def _text_config(arch: str, spec: SyntheticSpec, tokenizer, vocab_size: int):
    from transformers import AutoConfig

    head_dim = spec.head_dim or spec.hidden // spec.heads
    extra = {"head_dim": head_dim} if arch in {"qwen3", "llama"} else {}
    return AutoConfig.for_model(
        arch, vocab_size=vocab_size, hidden_size=spec.hidden, num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads, num_key_value_heads=spec.kv_heads,
        intermediate_size=spec.intermediate, max_position_embeddings=32768,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, **extra)


def build_image_processor(arch: str, max_pixels: int = 1024 * 28 * 28):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    patch = 16 if arch == "qwen3_vl" else 14
    return Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                    min_pixels=(2 * patch) ** 2, max_pixels=max_pixels)


def build_model(spec: SyntheticSpec, seed: int = 0, dtype: torch.dtype = torch.float32,
                device: str = "cpu"):
    """A random-initialised model of `spec` (its weights made on `device`), its tokenizer and its
    image processor (None for the text-only architectures qwen2, qwen3, llama)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    tokenizer = build_tokenizer()
    vocab = max(len(tokenizer), 320)
    torch.manual_seed(seed)
    with torch.device(device):
        if spec.arch in TEXT_ARCHS:
            config = _text_config(spec.arch, spec, tokenizer, vocab)
            return AutoModelForCausalLM.from_config(config, dtype=dtype).eval(), tokenizer, None
        config = _config(spec, tokenizer, vocab_size=vocab)
        model = AutoModelForImageTextToText.from_config(config, dtype=dtype).eval()
    return model, tokenizer, build_image_processor(spec.arch)


def save_checkpoint(out: str | Path, spec: SyntheticSpec | str, seed: int = 0,
                    dtype: torch.dtype = torch.float32) -> Path:
    """Write a loadable HF checkpoint directory (config, weights, tokenizer, processor)."""
    spec = SIZES[spec] if isinstance(spec, str) else spec
    out = Path(out)
    model, tokenizer, processor = build_model(spec, seed=seed, dtype=dtype)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if processor is not None:
        processor.save_pretrained(out)
    (out / "vlcache_synthetic.json").write_text(json.dumps({"spec": spec.__dict__, "seed": seed}))
    return out
