"""Qwen2.5-VL with selective prefill over vLLM's paged KV cache (eager mode; imports vLLM).

`forward(..., reuse=step)` runs the language model layer by layer. At layer l only the rows
`rows.computed` get norm, Q/K/V, attention and MLP; a hit image's other rows take the entry's
pre-RoPE K rotated at the rows' new M-RoPE positions (the layer's own rotary embedding) and the
entry's V, written into the request's paged slots before attention. The computed rows attend
through vLLM's own CPU kernel, one pseudo-request per run of consecutive positions (rows.py).
A step without `reuse` is vLLM's forward unchanged.
"""

from __future__ import annotations

import dataclasses

import torch
from vllm import _custom_ops as ops
from vllm import envs
from vllm.forward_context import get_forward_context
from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration

from vlcache_vllm.reuse.rows import LayerRows, Runs, StepImage, Window, layer_kv, plan_layers
from vlcache_vllm.reuse.step import Step


class VlcacheQwen2_5_VL(Qwen2_5_VLForConditionalGeneration):
    """vLLM's Qwen2.5-VL; a step that carries `reuse` runs the selective layer loop."""

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                intermediate_tensors=None, inputs_embeds: torch.Tensor | None = None,
                reuse: Step | None = None, **kwargs: object):
        if reuse is None:
            return super().forward(input_ids, positions, intermediate_tensors, inputs_embeds,
                                   **kwargs)
        if intermediate_tensors is not None:
            raise NotImplementedError("vlcache reuse runs without pipeline parallelism")
        lm = self.language_model.model
        h = lm.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        return selective_forward(lm, h, positions, reuse)


def selective_forward(lm, h: torch.Tensor,  # [T, H] the step's input embeddings
                      positions: torch.Tensor,  # [3, T] M-RoPE positions
                      step: Step) -> torch.Tensor:  # [T, H] final-normed hidden states
    fc = get_forward_context()
    layers = list(lm.layers[lm.start_layer:lm.end_layer])
    meta = fc.attn_metadata[layers[0].self_attn.attn.layer_name]
    windows = step.windows = windows_of(meta)
    num_rows = windows[-1].row + windows[-1].count
    plans = plan_layers(windows, step.images, len(layers), num_rows)
    step.reused_rows = sum(r.rows.numel() for rows in plans for r in rows.reused)
    h = h.clone()  # the runner's input buffer stays as it was
    residual = None
    scheduled: dict[int, object] = {}
    for index, (layer, rows) in enumerate(zip(layers, plans, strict=True)):
        h, residual = layer_step(layer, index, h, residual, positions, rows, step, fc,
                                 scheduled)
    h, _ = lm.norm(h, residual)
    return h


def windows_of(meta) -> list[Window]:
    """Each request's scheduled rows, from the step's attention metadata."""
    qsl = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    return [Window(qsl[i], seq_lens[i] - (qsl[i + 1] - qsl[i]), qsl[i + 1] - qsl[i])
            for i in range(len(seq_lens))]


def layer_step(layer, index: int, h: torch.Tensor, residual: torch.Tensor | None,
               positions: torch.Tensor, rows: LayerRows, step: Step, fc,
               scheduled: dict[int, object]) -> tuple[torch.Tensor, torch.Tensor]:
    idx = rows.computed
    x_h = h if idx is None else h[idx]  # [c, H]
    x_res = None if residual is None else (residual if idx is None else residual[idx])
    if x_res is None:
        x_res = x_h
        x = layer.input_layernorm(x_h)
    else:
        x, x_res = layer.input_layernorm(x_h, x_res)
    x = attention(layer.self_attn, index, x, positions, rows, step, fc, scheduled)
    x, x_res = layer.post_attention_layernorm(x, x_res)
    x = layer.mlp(x)
    if idx is None:
        return x, x_res
    if residual is None:  # rows not computed at layer 0 are never computed again
        residual = h.clone()
    h.index_copy_(0, idx, x)
    residual.index_copy_(0, idx, x_res)
    return h, residual


def attention(mod, index: int, x: torch.Tensor, positions: torch.Tensor, rows: LayerRows,
              step: Step, fc, scheduled: dict[int, object]) -> torch.Tensor:
    qkv, _ = mod.qkv_proj(x)
    q, k, v = qkv.split([mod.q_size, mod.kv_size, mod.kv_size], dim=-1)
    kvh, d = mod.num_kv_heads, mod.head_dim
    for cap in rows.captured:  # a miss being saved: its pre-RoPE K and V
        image = step.images[cap.image]
        image.captured_keys[index, cap.local] = k[cap.at].reshape(-1, kvh, d)
        image.captured_values[index, cap.local] = v[cap.at].reshape(-1, kvh, d)
    pos = positions if rows.computed is None else positions[:, rows.computed]
    q, k = mod.rotary_emb(pos, q, k)
    if rows.computed is None:
        out = mod.attn(q, k, v)  # vLLM's own path
    else:
        out = paged_attention(mod, index, q, k, v, positions, rows, step.images, fc,
                              scheduled)
    out, _ = mod.o_proj(out)
    return out


def paged_attention(mod, index: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    positions: torch.Tensor, rows: LayerRows, images: list[StepImage], fc,
                    scheduled: dict[int, object]) -> torch.Tensor:  # [c, nh*d]
    attn = mod.attn
    impl = attn.impl
    meta = fc.attn_metadata[attn.layer_name]
    slots = fc.slot_mapping[attn.layer_name]
    kvh, d, nh = impl.num_kv_heads, impl.head_size, impl.num_heads
    k, v = k.view(-1, kvh, d), v.view(-1, kvh, d)

    def rotate(batch_rows: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
        flat = cached.reshape(-1, kvh * d)  # pre-RoPE; rotated at the rows' new positions
        return mod.rotary_emb(positions[:, batch_rows], flat.clone(), flat)[1].view(-1, kvh, d)

    written, k_all, v_all = layer_kv(rows, images, index, k, v, rotate)
    impl.do_kv_cache_update(attn, k_all, v_all, attn.kv_cache, slots[written])
    sub = scheduled.get(id(rows))
    if sub is None:
        sub = scheduled[id(rows)] = run_metadata(meta, rows.runs, impl, attn, q.dtype,
                                                 slots[rows.computed])
    out = q.new_empty(q.shape[0], nh, d)
    impl.forward(attn, q.view(-1, nh, d), k, v, attn.kv_cache, sub, output=out)
    return out.view(q.shape[0], nh * d)


def run_metadata(meta, runs: Runs, impl, attn, dtype: torch.dtype, slot_mapping: torch.Tensor):
    """vLLM's CPU attention metadata for the runs as pseudo-requests (shared block tables)."""
    scheduler = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=int(runs.seq_lens.numel()), num_heads=impl.num_heads,
        num_kv_heads=impl.num_kv_heads, head_dim=impl.head_size, seq_lens=runs.seq_lens,
        dtype=dtype, query_start_loc=runs.query_start, causal=True,
        sliding_window_size=impl.sliding_window, isa=attn.isa,
        enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV, kv_cache_dtype=impl.kv_cache_dtype)
    return dataclasses.replace(
        meta, num_actual_tokens=int(runs.query_start[-1]), max_query_len=runs.max_query_len,
        query_start_loc=runs.query_start, max_seq_len=runs.max_seq_len,
        seq_lens=runs.seq_lens, block_table=meta.block_table[runs.request],
        slot_mapping=slot_mapping, scheduler_metadata=scheduler, causal=True)
