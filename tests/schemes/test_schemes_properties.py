"""Property tests: the schemes' and the diagnostics' invariants hold for every shape, length and head count.

Expectations come from the definitions of the schemes and diagnostics (README), not from the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from biasviz.diagnostics.measures import diagnose_array, subtract_diagonal
from biasviz.schemes import SCHEMES
from biasviz.schemes.alibi import geometric_slopes, interleaved_slopes
from biasviz.schemes.t5 import causal_bucket

BIAS_SCHEMES = [name for name, cls in SCHEMES.items() if cls.adds_bias]
WIDTH = 16
SETTINGS = settings(max_examples=40, deadline=None)

heads = st.integers(1, 16)
lengths = st.integers(1, 64)
batches = st.integers(1, 3)
seeds = st.integers(0, 2**16)


def _bias(name: str, h: int, t: int, b: int, seed: int, threshold: float | None = None) -> torch.Tensor:
    """The bias of a scheme with random (valid) parameters; FIRE's threshold L fixed to ``threshold``."""
    torch.manual_seed(seed)
    scheme = SCHEMES[name](h, WIDTH)
    with torch.no_grad():
        for p in scheme.parameters():  # random parameters, within the valid range
            p.copy_(torch.rand_like(p) * 1.5 + 0.05 if p.dim() <= 1 else torch.randn_like(p))
        if threshold is not None:
            scheme.threshold.fill_(threshold)
        scheme.constrain_()
        return scheme.bias(torch.randn(b, t, WIDTH), t, t).double()


def _causal(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))


def test_every_bias_scheme_is_covered() -> None:
    assert {"alibi", "kerple-log", "kerple-power", "fire", "t5", "cable"} <= set(BIAS_SCHEMES)


@pytest.mark.parametrize("name", BIAS_SCHEMES)
@SETTINGS
@given(h=heads, t=lengths, b=batches, seed=seeds)
def test_shape_finite_diagonal_toeplitz(name: str, h: int, t: int, b: int, seed: int) -> None:
    threshold = float(1 + seed % 64) if name == "fire" else None
    out = _bias(name, h, t, b, seed, threshold)
    dependent = SCHEMES[name].context_dependent
    assert tuple(out.shape) == ((b if dependent else 1), h, t, t)
    cells = torch.from_numpy(_causal(t))
    assert torch.isfinite(out[..., cells]).all()
    diag = torch.diagonal(out, dim1=-2, dim2=-1)  # (., H, T)
    if name in ("alibi", "kerple-log", "kerple-power", "cable"):
        assert diag.abs().max() <= 1e-6  # -m*0, -r1*log(1), -r1*0**r2, an empty sum
    else:  # FIRE: f(psi(0) / ...) = f(0); T5: w[bucket(0)]: one value per head along the diagonal
        assert (diag - diag[..., :1]).abs().max() <= 1e-5 * (1 + diag.abs().max())
    if dependent or t < 2:
        return
    step = out[..., 1:, 1:] - out[..., :-1, :-1]  # b(i+1, j+1) - b(i, j): 0 where it depends on i - j alone
    keep = cells[:-1, :-1].clone()
    if name == "fire":  # psi(max(L, i)) changes with i beyond the threshold L: compare rows i + 1 <= L only
        assert threshold is not None
        keep[int(threshold) :, :] = False
    picked = step[..., keep]
    # float32 rounding of the values themselves (a vectorised pow's body and tail round apart): relative to their size
    assert picked.numel() == 0 or picked.abs().max() <= 1e-5 * (1 + out[..., cells].abs().max())


@SETTINGS
@given(h=heads, t=lengths, seed=seeds)
def test_alibi_is_minus_slope_times_distance(h: int, t: int, seed: int) -> None:
    out = _bias("alibi", h, t, 1, seed)[0]  # ALiBi has no learned parameters: seed changes nothing
    slopes = np.array([2.0 ** (-8.0 * k / h) for k in range(1, h + 1)])
    d = np.subtract.outer(np.arange(t), np.arange(t))
    np.testing.assert_allclose(out.numpy(), -slopes[:, None, None] * d, rtol=1e-6, atol=1e-6)


@SETTINGS
@given(h=heads)
def test_alibi_slopes_positive_and_decreasing(h: int) -> None:
    geo = np.array(geometric_slopes(h))
    assert (geo > 0).all() and (np.diff(geo) < 0).all() and geo[-1] == pytest.approx(2.0**-8)
    inter = np.array(interleaved_slopes(h))
    p = 2 ** int(np.floor(np.log2(h)))
    assert len(inter) == h and (inter > 0).all() and (np.diff(inter[:p]) < 0).all()


@SETTINGS
@given(buckets=st.sampled_from([8, 16, 32, 64]), max_distance=st.integers(20, 300))
def test_t5_bucket_monotone_and_bounded(buckets: int, max_distance: int) -> None:
    if max_distance <= buckets // 2:
        max_distance = buckets
    d = torch.arange(0, 4 * max_distance)
    got = causal_bucket(d, buckets, max_distance).numpy()
    assert (np.diff(got) >= 0).all() and got.min() == 0 and got.max() < buckets
    exact = buckets // 2
    np.testing.assert_array_equal(got[:exact], np.arange(exact))  # one bucket per small distance
    assert (got[4 * max_distance - 1 :] == buckets - 1).all()  # far distances share the last bucket


@SETTINGS
@given(h=heads, t=st.integers(2, 64), seed=seeds)
def test_cable_is_a_difference_of_cumulative_costs(h: int, t: int, seed: int) -> None:
    out = _bias("cable", h, t, 1, seed)[0].numpy()  # (H, T, T)
    cells = _causal(t)
    assert (out[:, cells] <= 1e-6).all()  # -sum of softplus values: never positive
    # b(i, j) = b(i, 0) - b(j, 0): additive along the path, as s_i - s_j is
    np.testing.assert_allclose(out, out[:, :, :1] - out[:, :, :1].transpose(0, 2, 1), atol=1e-4)


# -- diagnostics -----------------------------------------------------------------------------------------


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
