"""Per-cell moments over samples (:mod:`biasviz.summaries.moments`) against numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.moments import Moments, ShiftedSums
from tests.summaries.test_layer import _bias


@pytest.mark.parametrize("samples", [1, 2, 15, 16, 17, 40])
def test_shifted_sums_give_numpys_mean_and_std_over_samples(samples: int) -> None:
    """Across the float64 folds (every 16 samples) and for one sample; values far from 0 with a small spread."""
    x = 50.0 + np.random.default_rng(samples).normal(size=(samples, 3, 5, 7)).astype(np.float32)
    sums = ShiftedSums()
    for a in range(samples):
        sums.add(torch.from_numpy(x[a]))
    for r0, r1, keys in ((0, 5, 7), (1, 3, 4)):
        mean, std = sums.rows(r0, r1, keys)
        want = x.astype(np.float64)[:, :, r0:r1, :keys]
        np.testing.assert_allclose(mean.numpy(), want.mean(0), rtol=1e-6)
        np.testing.assert_allclose(std.numpy(), want.std(0), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
def test_the_spreads_square_root_is_correctly_rounded_on_zeros_subnormals_and_views(threads: int) -> None:
    """Every value as float64's square root rounded once to float32, in place, in a strided view, split over
    threads or not; torch's own CPU kernel is off by one unit in the last place on many values."""
    from biasviz.summaries.moments import PARALLEL_VALUES, sqrt_

    g = torch.Generator().manual_seed(3)
    scales = torch.tensor([1.0, 1e-3, 1e-40, 0.0, 7.0, 1e-38])[:, None]  # normal, subnormal, zero
    base = torch.rand(6, 2 * PARALLEL_VALUES // 6 + 5, generator=g) * scales
    kept = base[:, :3].clone()
    view = base[:, 3:]  # rows of the base, not contiguous
    want = view.double().sqrt().float()
    assert ((view > 0) & (view < torch.finfo(torch.float32).tiny)).sum() > 1000 and (view == 0).sum() > 1000
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert sqrt_(view) is view
    finally:
        torch.set_num_threads(before)
    assert torch.equal(view, want) and torch.equal(base[:, :3], kept)


def test_identical_samples_have_a_spread_of_exactly_zero() -> None:
    sums = ShiftedSums()
    x = torch.randn(2, 4, 4) * 1e3
    for _ in range(20):
        sums.add(x)
    mean, std = sums.rows(0, 4, 4)
    assert torch.equal(mean, x) and not std.any()


def test_moments_merge_in_any_grouping() -> None:
    x = torch.from_numpy(_bias(7)[:, 0].astype(np.float64))
    whole = Moments.of(x)
    parts = Moments.of(x[:2]).merged(Moments.of(x[2:3])).merged(Moments.of(x[3:]))
    torch.testing.assert_close(parts.mean, whole.mean)
    torch.testing.assert_close(parts.std(), whole.std())
