"""Property tests of the diagnostics (:mod:`biasviz.diagnostics.measures`): a Toeplitz bias scores zero, per-row
constants vanish with the diagonal normalization, and the measures are invariant to a shift and a positive scale.

Expectations come from the definitions of the diagnostics (README), not from the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from biasviz.diagnostics.measures import diagnose_array, subtract_diagonal
from tests.properties import SETTINGS, _causal, seeds


def _toeplitz(rng: np.random.Generator, s: int, h: int, t: int) -> np.ndarray:
    g = rng.normal(size=(h, t))
    d = np.subtract.outer(np.arange(t), np.arange(t)).clip(min=0)
    b = g[:, d]  # b(i, j) = g(i - j)
    b[:, ~_causal(t)] = np.nan
    return np.repeat(b[None], s, axis=0)


def _metrics(bias: np.ndarray) -> list[tuple[float | None, float | None]]:
    return [(r.context_dependence, r.toeplitz_residual) for r in diagnose_array(bias)]


samples = st.integers(2, 4)

diag_lengths = st.integers(3, 24)

diag_heads = st.integers(1, 4)


@SETTINGS
@given(s=samples, h=diag_heads, t=diag_lengths, seed=seeds)
def test_toeplitz_identical_samples_give_zeros(s: int, h: int, t: int, seed: int) -> None:
    b = _toeplitz(np.random.default_rng(seed), s, h, t)
    for dependence, residual in _metrics(b):
        assert dependence == pytest.approx(0.0, abs=1e-9) and residual == pytest.approx(0.0, abs=1e-9)


@SETTINGS
@given(s=samples, h=diag_heads, t=diag_lengths, seed=seeds)
def test_row_constants_removed_by_diagonal_normalization(s: int, h: int, t: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    b = _toeplitz(rng, s, h, t) + rng.normal(scale=5.0, size=(1, h, t, 1))  # a per-row constant c_h(i)
    assert all(r == pytest.approx(0.0, abs=1e-9) for _, r in _metrics(subtract_diagonal(b)))
    residuals = [r for _, r in _metrics(b)]
    assert max(r or 0.0 for r in residuals) > 1e-3  # without the normalization the rows show


@SETTINGS
@given(s=samples, h=diag_heads, t=diag_lengths, seed=seeds, shift=st.floats(-1e3, 1e3),
       scale=st.floats(1e-2, 1e2))  # fmt: skip
def test_invariant_to_shift_and_positive_scale(s: int, h: int, t: int, seed: int, shift: float, scale: float) -> None:
    rng = np.random.default_rng(seed)
    b = rng.normal(size=(s, h, t, t))
    b[..., ~_causal(t)] = np.nan
    base = _metrics(b)
    assert all(d is not None and d > 0 for d, _ in base)  # random samples do depend on the context
    for other in (_metrics(b + shift), _metrics(b * scale)):
        for (d0, r0), (d1, r1) in zip(base, other, strict=True):
            assert d1 == pytest.approx(d0, rel=1e-6, abs=1e-9) and r1 == pytest.approx(r0, rel=1e-6, abs=1e-9)
