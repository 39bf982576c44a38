"""The explorer's distance profiles: each diagonal's mean and standard deviation over its finite cells, against a
loop over the diagonals with numpy's own mean and std."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from biasviz.explorer.profiles import distance_profile


def _unpacked(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f4")


def _by_loop(m: np.ndarray, d0: int) -> tuple[np.ndarray, np.ndarray]:
    n = m.shape[-1]
    mean, std = np.full(n - d0, np.nan), np.full(n - d0, np.nan)
    for k, d in enumerate(range(d0, n)):
        diag = np.diagonal(m, -d)
        diag = diag[np.isfinite(diag)]
        if diag.size:
            mean[k], std[k] = diag.mean(dtype=np.float64), diag.std(dtype=np.float64)
    return mean.astype(np.float32), std.astype(np.float32)


@pytest.mark.parametrize("causal", [True, False])
def test_every_diagonal_against_numpy(causal: bool) -> None:
    rng = np.random.default_rng(3)
    m = (rng.standard_normal((40, 40)) * 5 + np.subtract.outer(np.arange(40), np.arange(40))).astype(np.float32)
    if causal:
        m[np.triu_indices(40, 1)] = np.nan
    m[rng.random((40, 40)) < 0.1] = np.nan  # cells not attended
    m[np.arange(5, 40), np.arange(0, 35)] = np.nan  # a whole diagonal (d = 5) with no finite cell
    got = distance_profile(m)
    d0 = 0 if causal else -39
    assert got["d0"] == d0
    mean, std = _by_loop(m, d0)
    np.testing.assert_allclose(_unpacked(got["mean"]), mean, rtol=1e-6, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(_unpacked(got["std"]), std, rtol=1e-5, atol=1e-6, equal_nan=True)
    assert np.isnan(_unpacked(got["mean"])[5 - d0]) and np.isnan(_unpacked(got["std"])[5 - d0])
