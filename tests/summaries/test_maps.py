"""Block maps of a block of rows (:mod:`biasviz.summaries.maps`) against numpy float64, fed in uneven chunks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.maps import BlockMaps, _group_sums, zero_above_
from tests.summaries.test_replay_finish import H, T, _chunks, _moments


@pytest.mark.parametrize("dim", [-1, -2])
@pytest.mark.parametrize(
    ("n", "start", "size"), [(7, 1, 3), (9, 0, 3), (2, 5, 4), (1, 3, 8), (12, 6, 1), (13, 1, 2), (19, 2, 4), (20, 0, 5)]
)
def test_group_sums_are_sums_over_runs_of_equal_block(dim: int, n: int, start: int, size: int) -> None:
    x = torch.from_numpy(np.random.default_rng(n).normal(size=(2, n, n)))
    got = _group_sums(x, dim, start, size).numpy()
    block = (start + np.arange(n)) // size
    want = np.stack([np.moveaxis(x.numpy(), dim, 0)[block == b].sum(0) for b in np.unique(block)])
    np.testing.assert_allclose(np.moveaxis(got, dim, 0), want, rtol=1e-12)


def test_zero_above_sets_the_upper_cells_of_a_view_in_place_and_leaves_the_rest() -> None:
    x = torch.randn(2, 4, 9)
    x[..., 7:] = float("-inf")
    x[0, 0, 6] = float("nan")
    before = x.clone()
    view = x[..., :8]  # rows 4 .. 7 against keys 0 .. 7: the square is keys 4 .. 7
    assert zero_above_(view) is view
    i, j = np.indices((4, 8))
    above = torch.from_numpy(j > i + 4)
    assert (view[:, above] == 0).all() and torch.equal(view[:, ~above], before[..., :8][:, ~above])
    assert torch.equal(x[..., 8], before[..., 8])  # outside the view: untouched


def test_block_maps_of_uneven_chunks_equal_numpy_block_sums() -> None:
    x = _moments(1)
    maps = BlockMaps(H, T, 4, torch.device("cpu"), ("mean", "std"))
    for r0, r1 in _chunks():
        maps.add(r0, torch.from_numpy(x[:, :, r0:r1, :r1].copy()))
    assert maps.finite()
    nb = -(-T // 4)
    want = np.zeros((2, H, nb, nb))
    for q in range(nb):
        for k in range(nb):
            want[:, :, q, k] = x[:, :, 4 * q : 4 * q + 4, 4 * k : 4 * k + 4].astype(np.float64).sum((-2, -1))
    np.testing.assert_allclose(maps.stacked.numpy(), want, rtol=1e-6, atol=1e-5)
    bad = torch.from_numpy(x[:, :, :3, :3].copy())
    bad[1, 0, 2, 1] = float("inf")
    maps.add(0, bad)
    bad[1, 0, 2, 1] = float("-inf")  # never cancelled by a later value
    maps.add(0, bad)
    assert not maps.finite()
