"""Adapters over `transformers` decoder models: Qwen2-VL / Qwen2.5-VL / Qwen3-VL and text-only.

They expose the pieces the selective prefill needs and nothing else: the model's own positions
(`get_rope_index` M-RoPE for the VL models, 0..S-1 for text-only ones) and rotary tables, a
decoder layer in two halves (input norm + QKV, then output projection + MLP) so the reuse loop
can run each layer on any subset of tokens, and, for the VL models, the vision tower.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vlcache.kernels import usable
from vlcache.kernels.malloc import keep_freed_memory
from vlcache.keys import ModelFingerprint
from vlcache.models.mlp import fuse_vision_mlps, gated_mlp, is_gated
from vlcache.models.patch_embed import patch_conv_as_linear
from vlcache.models.rms_norm import chunk_rms_norms

SUPPORTED_ARCHITECTURES = {
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "qwen3_vl": "Qwen3VLForConditionalGeneration",
}
TEXT_ARCHITECTURES = {
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "llama": "LlamaForCausalLM",
}


@dataclass
class EncodedImage:
    embeds: torch.Tensor  # [N, H]
    deepstack: torch.Tensor | None  # [D, N, H] (Qwen3-VL) or None


class DecoderAdapter:
    """The decoder stack of a loaded HF model; tensors are for one sequence (no batch dim)."""

    image_token_id: int | None = None  # None: the model takes no images

    def __init__(self, model: torch.nn.Module, lm: torch.nn.Module, text_config,
                 fingerprint: ModelFingerprint) -> None:
        if getattr(text_config, "use_sliding_window", False):
            raise ValueError("sliding-window attention checkpoints are not supported")
        chunk_rms_norms(model)  # bit-identical results, 2.5x faster over many rows on the CPU
        usable(next(model.parameters()))  # fp32 on the CPU: builds vlcache's kernels now
        # (once per machine and install, ~25 s) rather than in the first request
        self.model = model
        self.fingerprint = fingerprint
        self.architecture: str = model.config.model_type
        self.layers = lm.layers
        self.norm = lm.norm
        self.embed_tokens = lm.embed_tokens
        self.rotary = lm.rotary_emb
        self.lm_head = model.lm_head
        attn = self.layers[0].self_attn
        self.num_layers: int = len(self.layers)
        self.hidden_size: int = text_config.hidden_size
        self.num_heads: int = text_config.num_attention_heads
        self.kv_heads: int = text_config.num_key_value_heads
        self.head_dim: int = attn.head_dim
        self.scaling: float = attn.scaling
        self.qk_norm: bool = hasattr(attn, "k_norm")
        self.dtype: torch.dtype = next(model.parameters()).dtype
        self.device: torch.device = next(model.parameters()).device
        self.packing: str = "off"  # decoder projections packed (pack_weights)
        if self.device.type == "cpu":
            keep_freed_memory()  # large activations reuse freed memory, no page faults

    def pack_weights(self, mode: str = "auto") -> str:
        """Pack the decoder layers' projections (models/packing.py): `auto`, `dual`, `packed`
        or `off`; -> the packing the model has (once packed, it stays)."""
        from vlcache.models.packing import pack_decoder_layers, resolve_packing

        resolved = resolve_packing(mode, self.device, self.dtype)
        if self.packing == "off" and resolved != "off":
            pack_decoder_layers(self.layers, dual=resolved == "dual")
            self.packing = resolved
        return self.packing

    def positions(
        self,
        input_ids: torch.Tensor,  # [S]
        grid_thw: torch.Tensor | None,  # [I, 3]
    ) -> torch.Tensor:  # [3, S]
        """Positions on three axes (all equal for text); text-only models use axis 0."""
        return torch.arange(input_ids.shape[0], device=input_ids.device).expand(3, -1)

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [S, head_dim] for positions [3, S], as the model computes them."""
        dummy = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(dummy, positions[0][None].to(self.device))
        return cos[0], sin[0]

    def qkv(
        self, layer: int, x: torch.Tensor  # [c, H]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # [c,nh,d], [c,kvh,d], [c,kvh,d]
        """Input norm and Q/K/V projections (plus per-head q/k norms where the model has them)."""
        block = self.layers[layer]
        attn = block.self_attn
        xn = block.input_layernorm(x)
        c = x.shape[0]
        fused = getattr(attn, "fused_qkv", None)  # models/packing.py
        if fused is not None:
            q, k, v = fused(xn)  # views of one [c, (nh + 2 kvh) d] result
        else:
            q, k, v = attn.q_proj(xn), attn.k_proj(xn), attn.v_proj(xn)
        q = q.view(c, self.num_heads, self.head_dim)
        k = k.view(c, self.kv_heads, self.head_dim)
        v = v.view(c, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = attn.q_norm(q), attn.k_norm(k)
        return q, k, v

    def finish(
        self, layer: int, x: torch.Tensor, attn_out: torch.Tensor  # [c, H], [c, nh*d]
    ) -> torch.Tensor:  # [c, H]
        """Output projection, residual, post-attention norm, MLP, residual."""
        block = self.layers[layer]
        h = block.self_attn.o_proj(attn_out).add_(x)
        return _mlp(block.mlp, block.post_attention_layernorm(h)).add_(h)

    def logits(self, h: torch.Tensor) -> torch.Tensor:  # [c, H] -> [c, V]
        return self.lm_head(self.norm(h)).float()

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:  # [S] -> [S, H]
        return self.embed_tokens(input_ids.to(self.device))


def _mlp(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:  # [c, H] -> [c, H]
    """The gated MLP (gate, up, down projections) as the model computes it, in fewer passes
    (models/mlp.py). Other MLPs run as they are."""
    return gated_mlp(mlp, x) if is_gated(mlp) else mlp(x)


class TextAdapter(DecoderAdapter):
    """A text-only causal LM (Qwen2, Qwen3, Llama layouts): 1-D RoPE, no vision tower."""

    def __init__(self, model: torch.nn.Module, fingerprint: ModelFingerprint) -> None:
        if model.config.model_type not in TEXT_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {model.config.model_type!r}")
        super().__init__(model, model.model, model.config, fingerprint)


class QwenVLAdapter(DecoderAdapter):
    """Qwen2-VL, Qwen2.5-VL, Qwen3-VL: adds the vision tower and the model's M-RoPE positions."""

    def __init__(self, model: torch.nn.Module, fingerprint: ModelFingerprint) -> None:
        config = model.config
        if config.model_type not in SUPPORTED_ARCHITECTURES:
            raise ValueError(f"unsupported architecture {config.model_type!r}")
        super().__init__(model, model.model.language_model, config.text_config, fingerprint)
        self.visual = model.model.visual
        patch_conv_as_linear(self.visual)  # the same products as its Conv3d, ~10x faster on CPU
        fuse_vision_mlps(self.visual)  # Qwen2.5-VL: gate and up as one matmul, one silu_mul
        self.image_token_id = config.image_token_id
        self.vision_start_id: int = config.vision_start_token_id
        self.vision_end_id: int = config.vision_end_token_id

    def encode_images(
        self,
        pixel_values: torch.Tensor,  # [P_total, C*T*ps*ps] patches of all images, concatenated
        grid_thw: torch.Tensor,  # [I, 3]
    ) -> list[EncodedImage]:
        out = self.model.model.get_image_features(
            pixel_values.to(self.device), grid_thw.to(self.device), return_dict=True
        )
        deep = getattr(out, "deepstack_features", None)
        images = []
        for i, embeds in enumerate(out.pooler_output):
            ds = torch.stack([d[i] for d in deep]) if deep else None
            images.append(EncodedImage(embeds.to(self.dtype), ds))
        return images

    def tokens_for_grid(self, grid_thw: torch.Tensor) -> int:
        merge = self.model.config.vision_config.spatial_merge_size
        return int(grid_thw.prod()) // (merge * merge)

    def positions(self, input_ids: torch.Tensor, grid_thw: torch.Tensor | None) -> torch.Tensor:
        """M-RoPE positions from the model's own get_rope_index (text-only: 0..S-1 on all axes)."""
        is_image = input_ids == self.image_token_id
        if grid_thw is None or not bool(is_image.any()):
            return super().positions(input_ids, grid_thw)
        pos, _ = self.model.model.get_rope_index(
            input_ids[None], mm_token_type_ids=is_image.int()[None], image_grid_thw=grid_thw
        )
        return pos[:, 0]

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dummy = torch.empty(0, dtype=self.dtype, device=self.device)
        cos, sin = self.rotary(dummy, positions[:, None, :].to(self.device))
        return cos[0], sin[0]
