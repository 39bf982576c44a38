"""The diagnostics of docs/diagnostics.md from running sums (biasviz.summaries.measures), fed as a layer's summary
streams samples and row blocks: equal to the full file's computation, exactly 0 where they should be, undefined with
one sample."""

from __future__ import annotations

import numpy as np
import pytest

from biasviz.diagnostics.measures import diagnose_array
from tests.summaries.test_layer import H, N, T, _bias, _feed, _masked


@pytest.mark.parametrize(("mode", "batch", "block"), [("joint", N, 1), ("cells", 2, 1), ("joint", N, 8)])
def test_profile_and_diagnostics_equal_the_full_file_computation(mode: str, batch: int, block: int) -> None:
    x = _bias(2)
    r = _feed(x, mode=mode, batch=batch, block=block).result()
    ref = diagnose_array(x)
    for h, d in enumerate(ref):
        np.testing.assert_allclose(r.profile[0, h], d.profile_mean, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(r.profile[1, h], d.profile_std, rtol=1e-5, atol=1e-5)
        got = r.diagnostics[h]
        assert got["context_dependence"] == pytest.approx(d.context_dependence, rel=1e-6)
        assert got["toeplitz_residual"] == pytest.approx(d.toeplitz_residual, rel=1e-6)
        assert got["separability_residual"] == pytest.approx(d.separability_residual, rel=1e-6)



def test_a_context_free_bias_has_zero_spread_exactly() -> None:
    one = _bias(4)[:1]
    x = np.repeat(one, N, axis=0)  # every sample the same
    for mode, batch in (("shared", 2), ("joint", N), ("cells", 2)):
        r = _feed(x, mode=mode, batch=batch).result()
        finite = ~np.isnan(r.std)
        assert (r.std[finite] == 0).all(), mode
        assert (r.diagnostics["context_dependence"] == 0).all(), mode
        np.testing.assert_allclose(r.mean, _masked(one[0]), rtol=1e-6, equal_nan=True)



def test_toeplitz_and_separable_biases_have_zero_residuals() -> None:
    i, j = np.indices((T, T))
    s = np.cumsum(np.random.default_rng(5).random(T))  # a cumulative decay: b = s_i - s_j
    sep = np.broadcast_to(s[:, None] - s[None, :], (1, H, T, T)).astype(np.float64)
    toe = np.broadcast_to(-np.log1p(np.clip(i - j, 0, None)), (1, H, T, T))
    r_sep = _feed(sep.astype(np.float32), mode="shared").result()
    r_toe = _feed(np.nan_to_num(toe).astype(np.float32), mode="shared").result()
    assert np.abs(r_sep.diagnostics["separability_residual"]).max() < 1e-5
    assert (r_toe.diagnostics["toeplitz_residual"] == 0).all()
    assert (r_toe.profile[1] == 0).all()  # a bias of i - j alone: no spread along a diagonal



def test_one_sample_leaves_context_dependence_undefined() -> None:
    r = _feed(_bias()[:1], batch=1).result()
    assert np.isnan(r.diagnostics["context_dependence"]).all()
