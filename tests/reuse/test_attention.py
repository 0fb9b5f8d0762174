"""Block-wise attention over the computed rows equals one dense causal mask, on every path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlcache.reuse import attention
from vlcache.reuse.attention import RowBlock, attend_blocks

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


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("chunk", [1 << 22, 64])  # 64: masked rows are split into several chunks
@pytest.mark.parametrize("merged", [True, False])  # False: the padded path other devices take
def test_blocks_equal_a_dense_mask(name, chunk, merged, monkeypatch):
    monkeypatch.setattr(attention, "MASK_ELEMENTS", chunk)
    monkeypatch.setattr(attention, "MERGED_DEVICES", {"cpu"} if merged else set())
    seq_len, runs, picked = CASES[name]
    blocks, positions = layout(seq_len, runs, [(s, n, p) for s, n, p in picked if p])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(positions.numel(), NH, D, generator=gen)
    k, v = (torch.randn(seq_len, KVH, D, generator=gen) for _ in range(2))
    got = attend_blocks(q, k, v, blocks, 0.3)
    torch.testing.assert_close(got, dense(q, k, v, positions, 0.3), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("merged", [True, False])
def test_long_run_takes_an_unmasked_path(merged, monkeypatch):
    """A run after a short prefix is attended without a mask: on the CPU as two flash calls
    (prefix keys, then its own keys causally) merged by log-sum-exp; elsewhere as causal
    attention with zero rows in front."""
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
