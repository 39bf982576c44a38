"""The finishing of a block of rows (per-cell moments into maps, diagonal sums, measures, key profile) against
numpy float64, fed in uneven chunks as :func:`biasviz.summaries.replay._finish` feeds it, and what it may and
may not change in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries import QuantitySummary
from biasviz.summaries.diagonals import DEV, DEV_SQ, SPREAD_SQ, DiagonalSums
from biasviz.summaries.maps import BlockMaps, _group_sums, zero_above_
from biasviz.summaries.moments import ShiftedSums
from biasviz.summaries.position import KeyProfile
from biasviz.summaries.scratch import Scratch

H, T = 3, 29
CHUNKS = (0, 3, 4, 11, 12, 20, T)  # uneven row chunks, some across block boundaries


def _chunks() -> list[tuple[int, int]]:
    return list(zip(CHUNKS[:-1], CHUNKS[1:], strict=True))


def _moments(seed: int = 0) -> np.ndarray:
    """(2, H, T, T) float32: a mean with a distance term and a spread, 0 above the diagonal."""
    rng = np.random.default_rng(seed)
    i, j = np.indices((T, T))
    x = np.stack([-0.5 * (i - j) + rng.normal(size=(H, T, T)), rng.random((H, T, T))]).astype(np.float32)
    return np.where(j <= i, x, np.float32(0))


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


@pytest.mark.parametrize("spread", [True, False])
def test_diagonal_sums_of_uneven_chunks_equal_numpy(spread: bool) -> None:
    x = _moments(2)[: 2 if spread else 1]
    sums = DiagonalSums(H, T, torch.device("cpu"))
    for r0, r1 in _chunks():
        sums.add(r0, torch.from_numpy(x[:, :, r0:r1, :r1].copy()))
    for d in range(T):
        cells = np.diagonal(x.astype(np.float64), offset=-d, axis1=-2, axis2=-1)  # (S, H, T - d)
        dev = cells[0] - cells[0, :, :1]
        slot = T - 1 - d
        np.testing.assert_allclose(sums.sums[DEV, :, slot], dev.sum(-1), rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(sums.sums[DEV_SQ, :, slot], (dev * dev).sum(-1), rtol=1e-5, atol=1e-4)
        want_sq = (cells[1] ** 2).sum(-1) if spread else 0.0
        np.testing.assert_allclose(sums.sums[SPREAD_SQ, :, slot], want_sq, rtol=1e-5)
        assert sums.count[slot] == T - d


def test_a_bias_of_the_distance_alone_has_exactly_zero_spread_along_each_diagonal() -> None:
    i, j = np.indices((T, T))
    f = np.random.default_rng(3).normal(size=(H, T)).astype(np.float32)
    x = np.where(j <= i, f[:, np.clip(i - j, 0, None)], np.float32(0))[None]
    sums = DiagonalSums(H, T, torch.device("cpu"))
    for r0, r1 in _chunks():
        sums.add(r0, torch.from_numpy(x[:, :, r0:r1, :r1].copy()))
    assert (sums.sums[DEV] == 0).all() and (sums.sums[DEV_SQ] == 0).all() and (sums.profile()[1] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_summaries_change_only_what_they_are_given(dtype: torch.dtype) -> None:
    """Not owned: the caller's tensors (a model's own block, a float64 view of kept moments) stay as they were;
    owned: changed in place, with the same result, also with the temporaries in memory kept from block to block."""
    x = torch.from_numpy(_moments(4)).to(dtype)
    x[0][..., torch.triu(torch.ones(T, T, dtype=torch.bool), 1)] = float("-inf")  # a bias above the diagonal
    results = []
    for owned in (False, True):
        s = QuantitySummary("bias", 0, heads=H, seq_len=T, block=4, causal=True, mode="joint",
                            device=torch.device("cpu"))  # fmt: skip
        s.samples = 3
        work = Scratch() if owned else None
        for r0, r1 in _chunks():
            given = x[:, :, r0:r1, :r1].clone()
            s.add_moments(r0, given, owned=owned, scratch=work)
            assert owned or torch.equal(given, x[:, :, r0:r1, :r1])
        results.append(s.result())
    for a, b in zip(*(vars(r).values() for r in results), strict=True):
        np.testing.assert_array_equal(a, b)


def test_moments_in_scratch_equal_new_ones_and_reuse_its_memory() -> None:
    sums = ShiftedSums()
    for a in range(3):
        sums.add(torch.randn(H, 6, 8, generator=torch.Generator().manual_seed(a)))
    scratch = Scratch()
    first = sums.moments(0, 6, 8, scratch)
    again = sums.moments(2, 4, 5, scratch)
    assert again.data_ptr() == first.data_ptr()
    assert torch.equal(again, sums.moments(2, 4, 5)) and torch.equal(again, torch.stack(sums.rows(2, 4, 5)))


def test_key_profile_of_uneven_chunks_equals_numpy() -> None:
    x = _moments(5)
    x[0] = np.abs(x[0])
    keys = KeyProfile(H, T, torch.device("cpu"))
    for r0, r1 in _chunks():
        keys.add(torch.from_numpy(x[:, :, r0:r1, :r1].copy()), None, r0)
    seen = np.arange(T, 0, -1)  # queries i >= j
    mean = x[0].astype(np.float64).sum(1) / seen
    var = (x.astype(np.float64) ** 2).sum((0, 2)) / seen - mean**2
    np.testing.assert_allclose(keys.result().numpy(), np.stack([mean, np.sqrt(var)]), rtol=1e-5, atol=1e-6)
