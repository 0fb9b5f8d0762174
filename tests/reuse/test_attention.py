"""Block-wise attention over the computed rows equals one dense causal mask, on every path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlcache import kernels
from vlcache.reuse import attention
from vlcache.reuse.attention import RowBlock, attend_blocks

needs_kernels = pytest.mark.skipif(kernels.cpu_kernels() is None,
                                   reason=f"vlcache's CPU kernels: {kernels.status()}")

NH, KVH, D = 4, 2, 8


def dense(q, k, v, positions, scale):  # the reference: one [rows, S] mask
    mask = torch.arange(k.shape[0])[None, :] <= positions[:, None]
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                         v.transpose(0, 1)[None], attn_mask=mask, scale=scale,
                                         enable_gqa=True)
    return out[0].transpose(0, 1).reshape(q.shape[0], -1)


def layout(seq_len: int, runs: list[tuple[int, int]], picked: list[tuple[int, int, list[int]]]):
    """Blocks and positions for text runs [(start, stop)] and segments [(start, length, picks)],
    interleaved in position order."""
    items = [(a, ("run", a, b)) for a, b in runs] + [(s, ("seg", s, n, p)) for s, n, p in picked]
    blocks, positions, row = [], [], 0
    for _, item in sorted(items):
        if item[0] == "run":
            _, a, b = item
            blocks.append(RowBlock.run(row, a, b - a))
            positions += list(range(a, b))
            row += b - a
        else:
            _, s, n, picks = item
            pos = torch.tensor([s + i for i in picks])
            blocks.append(RowBlock(row, len(picks), s, s + n, pos))
            positions += pos.tolist()
            row += len(picks)
    return blocks, torch.tensor(positions)


CASES = {
    # image at 4..36 reused, text before and a long text run after it (padded path: 36 <= 60)
    "long text after": (96, [(0, 4), (36, 96)], [(4, 32, [0, 1, 9])]),
    # a short question far into the sequence (merged path; else masked: 90 > 6)
    "short tail": (96, [(0, 2), (90, 96)], [(2, 88, [0, 5, 40, 87])]),
    # two reused segments, nothing picked in one, text between them
    "two segments": (80, [(0, 3), (20, 30), (70, 80)], [(3, 17, []), (30, 40, [3, 39])]),
    # everything from position 0 computed as one run
    "one run": (50, [(0, 50)], []),
}


def case_inputs(name: str, seed: int, nh: int = NH, kvh: int = KVH, d: int = D):
    """A case's blocks and positions, and random q [rows, nh, d], k and v [S, kvh, d]."""
    seq_len, runs, picked = CASES[name]
    blocks, positions = layout(seq_len, runs, [(s, n, p) for s, n, p in picked if p])
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(positions.numel(), nh, d, generator=gen)
    k, v = (torch.randn(seq_len, kvh, d, generator=gen) for _ in range(2))
    return blocks, positions, q, k, v


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("chunk", [1 << 22, 64])  # 64: masked rows are split into several chunks
@pytest.mark.parametrize("merged", [True, False])  # False: the padded path other devices take
def test_blocks_equal_a_dense_mask(name, chunk, merged, monkeypatch):
    monkeypatch.setattr(attention, "KERNELS", False)  # PyTorch's paths (the kernel: below)
    monkeypatch.setattr(attention, "MASK_ELEMENTS", chunk)
    monkeypatch.setattr(attention, "MERGED_DEVICES", {"cpu"} if merged else set())
    blocks, positions, q, k, v = case_inputs(name, 0)
    got = attend_blocks(q, k, v, blocks, 0.3)
    torch.testing.assert_close(got, dense(q, k, v, positions, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("merged", [True, False])
def test_long_run_takes_an_unmasked_path(merged, monkeypatch):
    """A run after a short prefix is attended without a mask: on the CPU as two flash calls
    (prefix keys, then its own keys causally) merged by log-sum-exp; elsewhere as causal
    attention with zero rows in front."""
    monkeypatch.setattr(attention, "KERNELS", False)
    monkeypatch.setattr(attention, "MERGED_DEVICES", {"cpu"} if merged else set())
    calls, flash_calls = [], []
    real = F.scaled_dot_product_attention
    real_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu

    def spy(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    def flash_spy(q, k, v, dropout, causal, **kwargs):
        flash_calls.append((k.shape[2], causal, kwargs.get("attn_mask")))
        return real_flash(q, k, v, dropout, causal, **kwargs)

    class Ops:  # torch.ops.aten with the flash op spied on
        def __getattr__(self, name):
            return flash_spy if name == "_scaled_dot_product_flash_attention_for_cpu" else (
                getattr(torch.ops.aten, name))

    blocks, positions = layout(96, [(0, 4), (36, 96)], [])
    q = torch.randn(positions.numel(), NH, D)
    k, v = torch.randn(96, KVH, D), torch.randn(96, KVH, D)
    want = dense(q, k, v, positions, 0.3)
    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(attention, "aten", Ops())
    got = attend_blocks(q, k, v, blocks, 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    if merged:  # the run at 0 is plain causal; the late run: its own 60 keys, then the 36 before
        assert calls == [None] and flash_calls == [(60, True, None), (36, False, None)]
    else:
        assert calls == [None, None] and flash_calls == []


@needs_kernels
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("heads", [(4, 2, 8), (14, 2, 64), (6, 6, 80)])  # nh, kvh, d
@pytest.mark.parametrize("block", [(32, 256), (2, 3)])  # small blocks: many steps, cut rows
def test_the_kernel_equals_a_dense_mask(name, heads, block, monkeypatch):
    monkeypatch.setattr(attention, "BLOCK_Q", block[0])
    monkeypatch.setattr(attention, "BLOCK_K", block[1])
    nh, kvh, d = heads
    blocks, positions, q, k, v = case_inputs(name, 1, nh, kvh, d)
    spied = []
    real = kernels.cpu_kernels().attention
    monkeypatch.setattr(kernels.cpu_kernels(), "attention",
                        lambda *a: spied.append(a[3].numel()) or real(*a))
    got = attend_blocks(q, k, v, blocks, d ** -0.5)
    assert spied == [0 if b.positions is None else b.count for b in blocks]  # no PyTorch path
    torch.testing.assert_close(got, dense(q, k, v, positions, d ** -0.5), atol=2e-5, rtol=1e-5)


@needs_kernels
def test_the_kernel_on_several_threads_and_strided_rows():
    gen = torch.Generator().manual_seed(2)
    qkv = torch.randn(300, 18, 64, generator=gen)  # a fused projection's output, viewed
    q, k, v = qkv[:, :14], qkv[:, 14:16], qkv[:, 16:]
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = attend_blocks(q, k, v, [RowBlock.run(0, 0, 300)], 0.125)
    finally:
        torch.set_num_threads(threads)
    torch.testing.assert_close(got, dense(q, k, v, torch.arange(300), 0.125), atol=2e-5,
                               rtol=1e-5)


def test_other_dtypes_keep_pytorch_attention(monkeypatch):
    called = []
    monkeypatch.setattr(attention, "_kernel_blocks", lambda *a: called.append(1))
    q, k, v = torch.randn(5, 4, 8).bfloat16(), torch.randn(5, 2, 8).bfloat16(), \
        torch.randn(5, 2, 8).bfloat16()
    attend_blocks(q, k, v, [RowBlock.run(0, 0, 5)], 0.3)
    assert called == []


@pytest.mark.parametrize("merged", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_bf16_blocks_equal_a_dense_mask(name, merged, monkeypatch):
    """Half-precision rows take PyTorch's paths (the kernel is fp32), the late run's merge
    included, and come back in the rows' dtype."""
    monkeypatch.setattr(attention, "MERGED_DEVICES", {"cpu"} if merged else set())
    blocks, positions, q, k, v = case_inputs(name, 3)
    got = attend_blocks(q.bfloat16(), k.bfloat16(), v.bfloat16(), blocks, 0.3)
    assert got.dtype == torch.bfloat16
    want = dense(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), positions, 0.3)
    torch.testing.assert_close(got.float(), want, atol=3e-2, rtol=3e-2)
