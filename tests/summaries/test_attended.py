""":class:`~biasviz.summaries.attended.Attended`'s counts against counts made here, a diagonal or a row at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries import attended as attended_module
from biasviz.summaries.attended import Attended


def _mask(t: int, heads: int) -> np.ndarray:
    """(H, T, T) bool: every head its own cells, some after the query, key 0 seen, a few rows seeing none."""
    rng = np.random.default_rng(t * 10 + heads)
    cells = rng.random((heads, t, t)) < 0.4
    cells[:, :, 0] = True
    cells[:, 2:4] = False
    return cells


@pytest.mark.parametrize(("t", "heads", "cells"), [(1, 1, 1 << 24), (13, 1, 1 << 24), (13, 3, 2 * 13 * 3 * 5),
                                                   (40, 2, 2 * 40 * 2 * 7), (40, 2, 1)])  # fmt: skip
def test_cells_at_each_i_minus_j_are_each_diagonal_s_count(t: int, heads: int, cells: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Blocks of rows that cut the mask evenly, unevenly (5 and 7 rows of 13 and 40) and a row at a time."""
    monkeypatch.setattr(attended_module, "SIGNED_CELLS", cells)
    mask = _mask(t, heads)
    want = np.stack([[np.trace(mask[h], offset=-d) for d in range(-(t - 1), t)] for h in range(heads)])
    got = Attended(torch.from_numpy(mask)).per_signed
    assert got.dtype == torch.float64 and got.shape == (heads, 2 * t - 1)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(Attended(torch.from_numpy(mask)).per_distance.numpy(), want[:, t - 1 :])


def test_counting_by_i_minus_j_sends_a_few_operations_a_block_of_rows_not_one_a_diagonal() -> None:
    """T = 2048, one head: (2T - 1) diagonals, but the mask's rows in blocks of 4096 (2^24 cells of 2T)."""
    from tests.summaries.test_replay_dispatch import Dispatched

    mask = torch.ones(1, 2048, 2048, dtype=torch.bool).tril()
    spy = Dispatched()
    with spy:
        spy.on = True
        got = Attended(mask).per_signed
    assert spy.kernels <= 10, spy.kernels
    assert torch.equal(got[0, 2047:], torch.arange(2048, 0, -1, dtype=torch.float64))
