"""A bias declared the same for every input, measured while a full file is written: the largest |b_a - b_0| against
numpy, a block of rows at a time or not, cells NaN in both counting 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.extraction.same_bias import SameBias, largest_gap


def _numpy_gap(others: np.ndarray, first: np.ndarray) -> float:
    if others.size == 0:
        return 0.0
    return float(np.nan_to_num(np.abs(others.astype(np.float64) - first), nan=0.0).max())


@pytest.mark.parametrize("elements", [1, 7, 1 << 22])  # a row at a time, a few rows, the whole at once
def test_the_largest_gap_is_numpy_s(elements: int) -> None:
    rng = np.random.default_rng(3)
    first = rng.normal(size=(1, 2, 6, 6)).astype(np.float32)
    others = first + rng.normal(scale=1e-3, size=(3, 2, 6, 6)).astype(np.float32)
    upper = np.triu(np.ones((6, 6), dtype=bool), 1)
    first[..., upper], others[..., upper] = np.nan, np.nan  # no query sees them: 0, not NaN
    others[2, 1, 4, 1] += 0.5
    got = largest_gap(torch.from_numpy(others), torch.from_numpy(first), elements=elements)
    assert got == pytest.approx(_numpy_gap(others, first), rel=1e-6)
    assert got == pytest.approx(0.5, abs=1e-2)


def test_no_other_sample_gives_0() -> None:
    first = torch.ones(1, 2, 4, 4)
    assert largest_gap(first[:0], first) == 0.0


def test_the_first_batch_against_its_first_sample_and_later_ones_against_it_kept() -> None:
    """The first batch compares its samples with its own first; kept, the first sample is what a later batch is compared
    with; the batch that first differs says so, once."""
    base = torch.arange(16.0).view(1, 1, 4, 4)
    same = SameBias()
    assert not same.differs({0: base.expand(2, -1, -1, -1).clone()}, keep=True)
    assert same.largest == 0.0
    later = base.clone()
    later[0, 0, 3, 2] += 0.25
    assert same.differs({0: later}, keep=True)
    assert same.largest == 0.25
    assert not same.differs({0: base + 1.0})  # differs again, but not first: the file switched already
    assert same.largest == 1.0


def test_not_kept_where_no_batch_follows() -> None:
    same = SameBias()
    same.differs({0: torch.zeros(3, 1, 2, 2)}, keep=False)
    assert same.first == {}
