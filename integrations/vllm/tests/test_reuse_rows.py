"""The reuse plugin's pure logic, without vLLM: which rows each layer computes, what it writes
into the paged cache (fresh K/V, cached K rotated at new positions), and that the runs given
to vLLM's varlen causal kernel attend each computed row to exactly its causal keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vlcache.reuse.registry import parse_policy
from vlcache.reuse.rope import apply_rope
from vlcache_vllm.reuse.rows import (
    StepImage,
    UnservedPolicy,
    Window,
    layer_kv,
    make_runs,
    plan_layers,
    selections_for,
)

KVH, NH, D = 2, 4, 8


def test_static_selections_are_the_first_tokens() -> None:
    sel = selections_for(parse_policy("static:0.05"), 100, 3)
    assert [s.tolist() for s in sel] == [list(range(5))] * 3
    assert [s.numel() for s in selections_for(parse_policy("static:1.0"), 7, 2)] == [7, 7]
    assert [s.numel() for s in selections_for(parse_policy("naive"), 7, 2)] == [0, 0]


@pytest.mark.parametrize("name", ["guard", "cacheblend", "query:0.05", "prefix"])
def test_a_policy_the_plugin_cannot_follow_is_refused(name: str) -> None:
    with pytest.raises(UnservedPolicy):
        selections_for(parse_policy(name), 64, 4)


def test_epic_computes_the_same_first_tokens_at_every_layer() -> None:
    assert [s.tolist() for s in selections_for(parse_policy("epic:3"), 64, 2)] == [[0, 1, 2]] * 2


def hit(request: int, start: int, n: int, counts: list[int], seed: int = 0) -> StepImage:
    g = torch.Generator().manual_seed(seed)
    layers = len(counts)
    return StepImage(request, start, n, f"img{seed}", [torch.arange(c) for c in counts],
                     torch.randn(layers, n, KVH, D, generator=g),
                     torch.randn(layers, n, KVH, D, generator=g))


def test_rows_of_a_hit_between_text_and_the_runs_it_leaves() -> None:
    # request 0: plain, 5 rows; request 1: 4 text, a 10-token image computing 2, 3 text
    windows = [Window(0, 0, 5), Window(5, 0, 17)]
    image = hit(1, 4, 10, [2, 2])
    plans = plan_layers(windows, [image], num_layers=2, num_rows=22)
    assert plans[0] is plans[1]  # a static plan: one LayerRows for every layer
    rows = plans[0]
    assert rows.computed.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 19, 20, 21]
    (reused,) = rows.reused
    assert reused.rows.tolist() == list(range(11, 19)) and reused.local.tolist() == list(
        range(2, 10))
    runs = rows.runs
    assert runs.query_start.tolist() == [0, 5, 11, 14]
    assert runs.seq_lens.tolist() == [5, 6, 17]  # run ends, in prompt positions
    assert runs.request.tolist() == [0, 1, 1]


def test_two_images_in_one_request_leave_three_runs() -> None:
    # text 0..2, image A 3..12 (computes 1), text 13..14, image B 15..22 (computes 2), text 23
    windows = [Window(0, 0, 24)]
    images = [hit(0, 3, 10, [1], seed=1), hit(0, 15, 8, [2], seed=2)]
    rows = plan_layers(windows, images, 1, 24)[0]
    assert rows.computed.tolist() == [0, 1, 2, 3, 13, 14, 15, 16, 23]
    assert [r.image for r in rows.reused] == [0, 1]
    assert rows.runs.seq_lens.tolist() == [4, 17, 24]
    assert rows.runs.query_start.tolist() == [0, 4, 8, 9]


def test_a_chunked_window_and_an_earlier_chunk() -> None:
    # the request's prompt positions 8..15 are scheduled (rows 0..7); the image spans 4..13
    windows = [Window(0, 8, 8)]
    image = hit(0, 4, 10, [3])
    rows = plan_layers(windows, [image], 1, 8)[0]
    assert rows.reused[0].local.tolist() == list(range(4, 10))  # positions 8..13
    assert rows.computed.tolist() == [6, 7]  # positions 14, 15
    assert rows.runs.seq_lens.tolist() == [16] and rows.runs.query_start.tolist() == [0, 2]


def test_nothing_reused_is_vllms_own_path() -> None:
    windows = [Window(0, 0, 30)]
    rows = plan_layers(windows, [hit(0, 4, 10, [10])], 1, 30)[0]
    assert rows.computed is None and rows.runs is None and not rows.reused


def test_a_saved_image_is_captured_inside_the_computed_rows() -> None:
    windows = [Window(0, 0, 20), Window(20, 0, 20)]
    saved = StepImage(1, 5, 6, "new", save=True)
    rows = plan_layers(windows, [hit(0, 2, 10, [1]), saved], 1, 40)[0]
    (cap,) = rows.captured
    assert rows.computed[cap.at].tolist() == list(range(25, 31))
    assert cap.local.tolist() == list(range(6))


def varlen_causal(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor,
                  slot_of: torch.Tensor, runs) -> torch.Tensor:
    """What vLLM's varlen kernel computes: query j of a (pseudo-)request with q_len queries
    and seq_len keys sits at position seq_len - q_len + j and attends keys [0, that]."""
    out = torch.empty(q.shape[0], NH, D)
    qs = runs.query_start.tolist()
    for i, (seq_len, req) in enumerate(zip(runs.seq_lens.tolist(), runs.request.tolist(),
                                           strict=True)):
        k = cache_k[slot_of[req, :seq_len]]  # [S, kvh, d]
        v = cache_v[slot_of[req, :seq_len]]
        qq = q[qs[i]:qs[i + 1]]
        pos = torch.arange(seq_len - qq.shape[0], seq_len)
        mask = torch.arange(seq_len)[None, :] <= pos[:, None]
        o = F.scaled_dot_product_attention(qq.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                           v.transpose(0, 1)[None], attn_mask=mask,
                                           enable_gqa=True)
        out[qs[i]:qs[i + 1]] = o[0].transpose(0, 1)
    return out


def rope_tables(positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    angles = positions[:, None].float() * inv[None]
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def test_written_cache_and_runs_equal_dense_causal_attention() -> None:
    """Two requests, one with a moved image whose entry holds exactly the fresh pre-RoPE K/V:
    writing the computed rows' K/V and the rotated cached K into paged slots, then attending
    by runs, gives every computed row the output of dense causal attention over fresh K/V."""
    torch.manual_seed(0)
    lengths = [7, 40]
    windows = [Window(0, 0, 7), Window(7, 0, 40)]
    start, n = 9, 24
    pos = torch.cat([torch.arange(length) + 100 * r for r, length in enumerate(lengths)])
    q_pre = torch.randn(47, NH, D)
    k_pre, v = torch.randn(47, KVH, D), torch.randn(47, KVH, D)
    image = StepImage(1, start, n, "img", [torch.arange(3)],
                      k_pre[7 + start:7 + start + n][None], v[7 + start:7 + start + n][None])
    rows = plan_layers(windows, [image], 1, 47)[0]
    idx = rows.computed
    cos, sin = rope_tables(pos)

    def rotate(batch_rows: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return apply_rope(keys, cos[batch_rows], sin[batch_rows])

    k_rot = apply_rope(k_pre[idx], cos[idx], sin[idx])
    written, k_all, v_all = layer_kv(rows, [image], 0, k_rot, v[idx], rotate)
    assert sorted(written.tolist()) == list(range(47))  # every row written exactly once
    # a paged cache: slots scattered at random, as vLLM's block tables place them
    slots = torch.randperm(100)[:47]
    cache_k, cache_v = torch.zeros(100, KVH, D), torch.zeros(100, KVH, D)
    cache_k[slots[written]] = k_all
    cache_v[slots[written]] = v_all
    slot_of = torch.zeros(2, 40, dtype=torch.long)
    slot_of[0, :7], slot_of[1, :40] = slots[:7], slots[7:]
    got = varlen_causal(apply_rope(q_pre[idx], cos[idx], sin[idx]), cache_k, cache_v, slot_of,
                        rows.runs)
    for w in windows:  # dense causal attention over each request's fresh K/V
        sl = slice(w.row, w.row + w.count)
        q_r = apply_rope(q_pre[sl], cos[sl], sin[sl]).transpose(0, 1)[None]
        k_r = apply_rope(k_pre[sl], cos[sl], sin[sl]).transpose(0, 1)[None]
        dense = F.scaled_dot_product_attention(q_r, k_r, v[sl].transpose(0, 1)[None],
                                               is_causal=True, enable_gqa=True)[0]
        dense = dense.transpose(0, 1)
        mine = (idx >= w.row) & (idx < w.row + w.count)
        torch.testing.assert_close(got[mine], dense[idx[mine] - w.row], atol=1e-5, rtol=1e-5)


def test_runs_split_at_gaps_and_requests() -> None:
    windows = [Window(0, 3, 4), Window(4, 0, 6)]
    runs = make_runs(windows, torch.tensor([0, 1, 3, 4, 5, 8, 9]))
    assert runs.query_start.tolist() == [0, 2, 3, 5, 7]
    assert runs.seq_lens.tolist() == [5, 7, 2, 6]
    assert runs.request.tolist() == [0, 0, 1, 1]
