"""Sums along the diagonals of a block of rows (:mod:`biasviz.summaries.diagonals`) against numpy float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.diagonals import DEV, DEV_SQ, SPREAD_SQ, DiagonalSums
from tests.summaries.test_replay_finish import H, T, _chunks, _moments


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
