"""A layer's computed rows: one contiguous run is sliced (no gather), anything else indexed."""

from __future__ import annotations

import torch

from vlcache.reuse.attention import RowBlock
from vlcache.reuse.layer import Rows


def test_a_contiguous_run_of_blocks_is_a_span():
    blocks = [RowBlock.run(0, 15, 5), RowBlock.run(5, 20, 30)]  # rows 15..49 in two blocks
    assert Rows(torch.arange(15, 50), blocks).span == (15, 50)
    assert Rows.all(40).span == (0, 40)


def test_gaps_and_picked_rows_are_not_a_span():
    gap = [RowBlock.run(0, 0, 4), RowBlock.run(4, 36, 10)]
    assert Rows(torch.cat([torch.arange(4), torch.arange(36, 46)]), gap).span is None
    picked = [RowBlock.run(0, 0, 4), RowBlock(4, 2, 4, 20, torch.tensor([4, 9]))]
    assert Rows(torch.tensor([0, 1, 2, 3, 4, 9]), picked).span is None


def test_pick_slices_a_run_and_indexes_the_rest():
    run = Rows(torch.arange(15, 50), [RowBlock.run(0, 15, 35)])
    assert run.pick == slice(15, 50) and Rows.all(40).pick == slice(None)
    index = torch.tensor([0, 1, 2, 3, 4, 9])
    picked = Rows(index, [RowBlock.run(0, 0, 4), RowBlock(4, 2, 4, 20, torch.tensor([4, 9]))])
    assert picked.pick is index
