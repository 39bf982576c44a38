"""Distance profiles (:mod:`biasviz.diagnostics.profiles`): per head, the mean and population std over samples and the
cells at each distance, against numpy's diagonals; causal and bidirectional cells, a bias stored once for every
sample, and a constant diagonal's std exactly 0."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from biasviz.diagnostics.profiles import ProfileAccumulator, dataset_profiles

T = 9


def by_diagonal(x: np.ndarray, distances: range) -> tuple[np.ndarray, np.ndarray]:
    """(sample, T, T) -> mean and population std over samples and cells with i - j = d, for each d."""
    values = [np.concatenate([np.diagonal(m, -d) for m in x]).astype(np.float64) for d in distances]
    return np.array([v.mean() for v in values]), np.array([v.std() for v in values])


def test_causal_profiles_are_numpys_diagonal_means_and_stds() -> None:
    x = np.random.default_rng(0).normal(size=(4, T, T))
    x[:, np.triu_indices(T, 1)[0], np.triu_indices(T, 1)[1]] = np.nan  # cells after the query are not used
    acc = ProfileAccumulator(T)
    for m in x:
        acc.add(m)
    mean, std = acc.result()
    want_mean, want_std = by_diagonal(x, range(T))
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(std, want_std, rtol=1e-12, atol=1e-12)
    assert std[-1] == pytest.approx(np.std(x[:, -1, 0]))  # distance T - 1: one cell per sample


def test_bidirectional_profiles_run_from_minus_t_plus_1() -> None:
    x = np.random.default_rng(1).normal(size=(3, T, T))
    acc = ProfileAccumulator(T, causal=False)
    assert acc.start == -(T - 1)
    for m in x:
        acc.add(m)
    mean, std = acc.result()
    assert mean.shape == (2 * T - 1,)
    want_mean, want_std = by_diagonal(x, range(-(T - 1), T))
    np.testing.assert_allclose(mean, want_mean, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(std, want_std, rtol=1e-12, atol=1e-12)


def test_a_constant_diagonal_has_a_std_of_exactly_0() -> None:
    d = np.subtract.outer(np.arange(T), np.arange(T))
    acc = ProfileAccumulator(T)
    for _ in range(5):
        acc.add(1e6 + 0.1 * d)  # large values with a fraction: a naive sum of squares leaves rounding noise
    mean, std = acc.result()
    assert (std == 0).all()
    np.testing.assert_allclose(mean, 1e6 + 0.1 * np.arange(T), rtol=0, atol=1e-9)


def test_a_matrix_counted_k_times_is_k_samples() -> None:
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(2, T, T))
    counted, repeated = ProfileAccumulator(T), ProfileAccumulator(T)
    counted.add(a, count=3)
    counted.add(b)
    for m in (a, a, a, b):
        repeated.add(m)
    assert counted.n == 4
    for got, want in zip(counted.result(), repeated.result(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_non_finite_used_cells_and_no_samples_are_errors() -> None:
    acc = ProfileAccumulator(4)
    m = np.zeros((4, 4))
    m[0, 3] = np.inf  # after the query: not used
    acc.add(m)
    m[3, 0] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite values in cells the model uses"):
        acc.add(m)
    acc.reset()
    with pytest.raises(ValueError, match="no samples given"):
        acc.result()
    with pytest.raises(ValueError, match="NaN or infinite"):
        ProfileAccumulator(4, causal=False).add(np.where(np.eye(4) > 0, np.inf, 0.0))


def test_dataset_profiles_are_per_head_and_normalize_each_row_to_its_diagonal(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 2, T, T)).astype(np.float32)
    with h5py.File(tmp_path / "x.h5", "w") as f:  # read one (sample, head) matrix at a time, as from a file
        ds = f.create_dataset("bias", data=x, chunks=(1, 1, T, T))
        p, normalized = dataset_profiles(ds), dataset_profiles(ds, normalize="diagonal")
    assert (p.start, p.samples, p.mean.shape, p.std.shape) == (0, 3, (2, T), (2, T))
    for h in range(2):
        want_mean, want_std = by_diagonal(x[:, h], range(T))
        np.testing.assert_allclose(p.mean[h], want_mean, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(p.std[h], want_std, rtol=1e-6, atol=1e-6)
    rows = x.astype(np.float64) - np.diagonal(x, axis1=-2, axis2=-1)[..., :, None]  # b(i, j) - b(i, i)
    for h in range(2):
        want_mean, want_std = by_diagonal(rows[:, h], range(T))
        np.testing.assert_allclose(normalized.mean[h], want_mean, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(normalized.std[h], want_std, rtol=1e-6, atol=1e-6)
    assert (normalized.mean[:, 0] == 0).all()


def test_a_bias_stored_once_counts_for_every_sample() -> None:
    one = np.random.default_rng(4).normal(size=(1, 2, T, T)).astype(np.float32)
    shared = SimpleNamespace(stored=one, repeat=5, shape=(5, 2, T, T))  # as the reader shows a bias_shared file
    p = dataset_profiles(shared, causal=False)
    assert (p.samples, p.start) == (5, -(T - 1))
    for h in range(2):  # five copies of one matrix: the spread over each diagonal's cells alone
        want_mean, want_std = by_diagonal(one[:, h], range(-(T - 1), T))
        np.testing.assert_allclose(p.mean[h], want_mean, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(p.std[h], want_std, rtol=1e-6, atol=1e-6)
    assert p.std[0, 0] == 0 and p.std[0, -1] == 0  # distances +-(T - 1): one cell, the same in every copy


def test_a_plain_numpy_array_is_read_as_its_samples() -> None:
    """A numpy array's ``repeat`` is a method, not a count of samples: every sample is read as it is."""
    x = np.random.default_rng(5).normal(size=(3, 2, T, T)).astype(np.float32)
    got = dataset_profiles(x)
    assert got.samples == 3
    for h in range(2):
        want_mean, want_std = by_diagonal(x[:, h], range(T))
        np.testing.assert_allclose(got.mean[h], want_mean, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got.std[h], want_std, rtol=1e-5, atol=1e-6)
