"""The cross-correlations behind ``positional_frequency`` (docs/position-measures.md), against sums over cells in
float64: a pair's products summed by distance through the inverse transform, and straight into distance bins
(Parseval)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.rotary import RotaryLayout
from biasviz.summaries.positional_frequency import PairCorrelations, bin_matrix

T = 37


def _direct(x: np.ndarray, y: np.ndarray, groups: list[np.ndarray], causal: bool) -> np.ndarray:
    """(groups, T): Σ over cells (i, j) at distance |i - j| (causal: i >= j only) of Σ_{dims of the group} x(i) y(j)."""
    i, j = np.indices((T, T))
    d = np.abs(i - j)
    kept = (i >= j) if causal else np.ones((T, T), bool)
    out = np.zeros((len(groups), T))
    for g, dims in enumerate(groups):
        cells = np.einsum("di,dj->ij", x[dims], y[dims])
        for dist in range(T):
            out[g, dist] = cells[(d == dist) & kept].sum()
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("interleaved", "rotary", "head_dim"), [(False, 8, 8), (True, 8, 8), (False, 6, 10)])
def test_pair_products_by_distance_and_by_bin_are_the_sums_over_cells(causal: bool, interleaved: bool, rotary: int,
                                                                     head_dim: int) -> None:  # fmt: skip
    rng = np.random.default_rng(rotary + head_dim + interleaved)
    x, y = rng.normal(size=(2, head_dim, T))
    f = np.arange(rotary // 2)
    pairs = [np.array([2 * p, 2 * p + 1]) if interleaved else np.array([p, p + rotary // 2]) for p in f]
    groups = pairs + ([np.arange(rotary, head_dim)] if head_dim > rotary else [])
    corr = PairCorrelations(RotaryLayout(interleaved=interleaved, rotary_dims=rotary), head_dim, T, causal)
    fx, fy = corr.transform(torch.from_numpy(x)), corr.transform(torch.from_numpy(y)).conj_physical_()
    products = corr.pair_products(fx, fy)
    want = _direct(x, y, groups, causal)
    np.testing.assert_allclose(corr.lags(products).numpy(), want, atol=1e-10)
    twice = corr.pair_products(fx, fy, corr.pair_products(fx, fy))  # added into what is given
    np.testing.assert_allclose(corr.lags(twice).numpy(), 2 * want, atol=1e-10)
    by_bin = bin_matrix(T)
    np.testing.assert_allclose((products @ corr.binned(by_bin)).real.numpy(), want @ by_bin.numpy().T, atol=1e-10)
