"""The diagnostics (README, "Reading the figures and diagnostics") on synthetic biases with closed-form answers."""

from __future__ import annotations

import numpy as np
import pytest

from biasviz.diagnostics.measures import diagnose_array, diagnose_dataset, diagnose_head, subtract_diagonal

T = 48


def _dist(t: int = T) -> np.ndarray:
    pos = np.arange(t)
    return pos[:, None] - pos[None, :]


def _masked(b: np.ndarray) -> np.ndarray:
    b = np.array(b, dtype=np.float64)
    b[..., _dist(b.shape[-1]) < 0] = np.nan
    return b


def _toeplitz(slope: float = 0.5, t: int = T) -> np.ndarray:
    d = _dist(t).astype(float)
    return _masked(-slope * d + np.sin(d))  # depends on i - j alone, not linear


def test_toeplitz_context_independent_bias_scores_exactly_zero() -> None:
    bias = np.stack([np.stack([_toeplitz(0.5), _toeplitz(0.1)])] * 3)  # 3 identical samples, 2 heads
    heads = diagnose_array(bias)
    assert [h.head for h in heads] == [1, 2]
    for h in heads:
        assert h.context_dependence == 0.0
        assert h.toeplitz_residual == 0.0
        np.testing.assert_allclose(h.profile_std, 0.0, atol=1e-12)


def test_profile_mean_is_the_bias_at_each_distance() -> None:
    h = diagnose_head([_toeplitz(0.25)] * 2)
    d = np.arange(T)
    np.testing.assert_allclose(h.profile_mean, -0.25 * d + np.sin(d), rtol=0, atol=1e-12)


def test_rows_shifted_by_a_constant_are_not_toeplitz_until_normalized() -> None:
    shifts = np.linspace(-3, 5, T)[:, None]  # a per-row constant: softmax cannot tell the difference
    bias = _toeplitz() + shifts
    raw = diagnose_head([bias, bias])
    assert raw.toeplitz_residual is not None and raw.toeplitz_residual > 0.1
    normalized = diagnose_head([bias, bias], normalize="diagonal")
    assert normalized.toeplitz_residual == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(subtract_diagonal(bias), subtract_diagonal(_toeplitz()), atol=1e-12)


def test_toeplitz_residual_matches_the_definition() -> None:
    rng = np.random.default_rng(1)
    bias = _masked(rng.normal(size=(T, T)))
    h = diagnose_head([bias])
    cells = _dist() >= 0
    d = _dist()[cells]
    values = bias[cells]
    diag_mean = np.bincount(d, weights=values) / np.bincount(d)
    expected = np.sqrt(np.mean((values - diag_mean[d]) ** 2)) / np.std(values)
    assert h.toeplitz_residual == pytest.approx(expected, rel=1e-12)


def test_sample_dependent_bias_matches_the_closed_form() -> None:
    # b_s = c_s * B: the std over samples at a cell is |B| std(c); the mean bias is mean(c) B.
    base = _toeplitz(0.3) + _masked(np.cos(np.arange(T))[:, None] * np.ones((T, T)))
    c = np.array([0.5, 1.0, 2.5, 4.0])
    h = diagnose_head([ci * base for ci in c])
    cells = _dist() >= 0
    expected = np.std(c) * np.mean(np.abs(base[cells])) / (abs(np.mean(c)) * np.std(base[cells]))
    assert h.context_dependence == pytest.approx(expected, rel=1e-10)
    assert h.samples == 4


def test_profile_std_spans_samples_and_positions() -> None:
    a, b = _masked(np.zeros((T, T))), _masked(np.full((T, T), 2.0))
    h = diagnose_head([a, b])
    np.testing.assert_allclose(h.profile_mean, 1.0)
    np.testing.assert_allclose(h.profile_std, 1.0)  # population std of {0, 2}


def test_one_sample_gives_no_context_dependence_with_a_note() -> None:
    h = diagnose_head([_toeplitz()])
    assert h.context_dependence is None
    assert any("2 samples" in n for n in h.notes)
    assert h.toeplitz_residual == 0.0


def test_constant_bias_reports_zero_not_nan() -> None:
    h = diagnose_head([_masked(np.full((T, T), 1.7))] * 2)
    assert h.context_dependence == 0.0 and h.toeplitz_residual == 0.0


def test_nan_in_causal_cells_is_an_error() -> None:
    bias = _toeplitz()
    bias[5, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        diagnose_head([bias])


def test_dataset_streaming_equals_in_memory(tmp_path) -> None:
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    bias = _masked(rng.normal(size=(3, 2, 16, 16))).astype(np.float32)
    with h5py.File(tmp_path / "b.h5", "w") as f:
        ds = f.create_dataset("bias", data=bias, chunks=(1, 1, 16, 16))
        streamed = list(diagnose_dataset(ds))
    in_memory = diagnose_array(bias)
    for s, m in zip(streamed, in_memory, strict=True):
        assert s.context_dependence == pytest.approx(m.context_dependence, rel=1e-12)
        assert s.toeplitz_residual == pytest.approx(m.toeplitz_residual, rel=1e-12)


def _causal_mean(matrix: np.ndarray) -> np.ndarray:
    return np.where(np.tril(np.ones(matrix.shape, dtype=bool)), matrix, np.nan)


def test_separability_is_zero_for_cumulative_decay_and_positive_otherwise() -> None:
    t = 48
    rng = np.random.default_rng(0)
    s = -np.cumsum(np.log1p(np.exp(rng.normal(size=t))))  # CABLE-like s_t = -sum softplus(.)
    i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    d = np.clip(i - j, 0, None).astype(float)
    decay = diagnose_head([_causal_mean(s[:, None] - s[None, :])])
    alibi = diagnose_head([_causal_mean(-0.25 * d)])
    kerple = diagnose_head([_causal_mean(-np.log1p(d))])
    assert decay.separability_residual == pytest.approx(0.0, abs=1e-12)
    assert alibi.separability_residual == pytest.approx(0.0, abs=1e-12)
    assert kerple.separability_residual > 0.01
    assert "separability_residual" in kerple.as_json()


def test_separability_residual_matches_a_least_squares_solver() -> None:
    t = 12
    rng = np.random.default_rng(1)
    b = _causal_mean(rng.normal(size=(t, t)))
    rows, cols = np.nonzero(np.tril(np.ones((t, t), dtype=bool)))
    design = np.zeros((rows.size, t))  # one equation s_i - s_j = b(i, j) per causal cell
    design[np.arange(rows.size), rows] += 1.0
    design[np.arange(rows.size), cols] -= 1.0
    target = b[rows, cols]
    s, *_ = np.linalg.lstsq(design, target, rcond=None)
    rms = np.sqrt(np.mean((target - design @ s) ** 2))
    h = diagnose_head([b])
    assert h.separability_residual == pytest.approx(rms / np.std(target), rel=1e-10)
