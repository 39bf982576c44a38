"""What a model computed, as the statistics see it (:mod:`biasviz.adapters.rows`): a block's sample count, rows and
keys read from its weights' shape, its tensors by kind, and the cells a call with no mask of its own attends (the
causal triangle from row r0 on, or every cell), checked against numpy's ``tril``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.rows import RowBlock, plain_cells


def test_a_blocks_sizes_are_its_weights_shape() -> None:
    """S samples, rows r0 .. r1 - 1, K keys: (S, H, rows, K) = (3, 2, 5, 9) from row 2 of a call that sees all 9
    keys (r1 = 7, K = T = 9); from row 4 of a causal call, K = r1 = 9."""
    block = RowBlock(layer=1, first=6, r0=2, weights=torch.zeros(3, 2, 5, 9))
    assert (block.samples, block.r1, block.keys) == (3, 7, 9)
    assert RowBlock(layer=1, first=6, r0=4, weights=torch.zeros(3, 2, 5, 9)).r1 == 9
    assert type(block.samples) is int and type(block.r1) is int and type(block.keys) is int
    assert block.length is None and block.mask is None and not block.by_sample  # nothing else said: a whole call


def test_of_gives_the_blocks_own_tensor_by_kind() -> None:
    w, s, b = torch.rand(1, 1, 2, 2), torch.rand(1, 1, 2, 2), torch.rand(1, 1, 2, 2)
    block = RowBlock(layer=0, first=0, r0=0, weights=w, scores=s, bias=b)
    assert block.of("weights") is w and block.of("scores") is s and block.of("bias") is b
    assert RowBlock(layer=0, first=0, r0=0, weights=w).of("bias") is None


@pytest.mark.parametrize(("t", "r0", "rows"), [(1, 0, 1), (6, 0, 6), (6, 2, 3), (6, 5, 1), (9, 4, 5)])
def test_causal_cells_are_rows_of_the_lower_triangle(t: int, r0: int, rows: int) -> None:
    """Row i attends keys 0 .. i: rows r0 .. r0 + rows - 1 of numpy's tril, whether K is r1 or every key T."""
    tril = np.tril(np.ones((t, t), dtype=bool))
    r1 = r0 + rows
    for keys in (r1, t):
        got = plain_cells(r0, rows, keys, True, torch.device("cpu"))
        assert got.shape == (1, 1, rows, keys) and got.dtype == torch.bool
        np.testing.assert_array_equal(got[0, 0].numpy(), tril[r0:r1, :keys])


def test_a_call_that_sees_every_key_attends_every_cell() -> None:
    got = plain_cells(3, 2, 7, False, torch.device("cpu"))
    assert got.shape == (1, 1, 2, 7) and got.dtype == torch.bool and bool(got.all())


def test_cells_are_the_calls_own_mask_where_it_has_one() -> None:
    attended = torch.tensor([[True, False], [False, True]])[None, None]
    block = RowBlock(layer=0, first=0, r0=0, weights=torch.zeros(2, 3, 2, 2), attended=attended)
    assert block.cells(causal=True) is attended and block.cells(causal=False) is attended


def test_cells_without_a_mask_of_its_own_follow_the_rule() -> None:
    """Rows 2, 3 of a causal call of 4 keys, worked out by hand; every cell where the call sees every key."""
    block = RowBlock(layer=0, first=0, r0=2, weights=torch.zeros(2, 3, 2, 4))
    assert block.cells(causal=True)[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert block.cells(causal=True).shape == (1, 1, 2, 4)
    assert block.cells(causal=False).tolist() == [[[[True] * 4] * 2]]
