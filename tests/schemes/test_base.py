"""What every scheme does as a :class:`~biasviz.schemes.base.PositionScheme`: options checked, the input ignored
unless the scheme depends on it, the bias one block of query rows at a time, and the shape, finiteness, diagonal
and Toeplitz structure of every bias for every shape, length and head count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given

from biasviz.common.errors import BiasvizError
from biasviz.schemes import SCHEMES, get_scheme
from tests.properties import SETTINGS, _causal, batches, heads, lengths, seeds
from tests.schemes.scheme_biases import H, T, _bias, scheme_bias

BIAS_SCHEMES = [name for name, cls in SCHEMES.items() if cls.adds_bias]


def test_context_independent_schemes_ignore_the_input() -> None:
    for name, cls in SCHEMES.items():
        if not cls.adds_bias or cls.context_dependent:
            continue
        a = scheme_bias(name, torch.randn(1, T, 48))
        b = scheme_bias(name, torch.randn(1, T, 48))
        np.testing.assert_array_equal(a, b)
        assert a.shape == (1, H, T, T), name


def test_unknown_option_is_refused() -> None:
    with pytest.raises(BiasvizError, match="unknown option"):
        get_scheme("t5")(H, 48, buckets=7)


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


ROW_CASES = [(name, {}) for name, cls in SCHEMES.items() if cls.adds_bias] + [
    ("fox", {"gate": "bias_only", "decay_time_min": 2.0, "decay_time_max": 64.0}),
    ("fox", {"gate": "fixed", "decay_time_min": 2.0, "decay_time_max": 64.0}),
]


def _row_blocks(t: int) -> list[tuple[int, int]]:
    """Blocks of 1, 2, 3, ... rows, then whatever is left: sizes vary and the last is uneven."""
    blocks, r0, rows = [], 0, 1
    while r0 < t:
        blocks.append((r0, min(t, r0 + rows)))
        r0, rows = blocks[-1][1], rows + 1
    return blocks


@pytest.mark.parametrize(("name", "options"), ROW_CASES, ids=lambda v: v if isinstance(v, str) else "-".join(
    str(x) for x in v.values()))  # fmt: skip
@pytest.mark.parametrize("t", [5, 37, 300])
def test_rows_are_the_slices_of_the_full_bias(name: str, options: dict, t: int) -> None:
    torch.manual_seed(0)
    scheme = get_scheme(name)(H, 48, **options)
    with torch.no_grad():
        for p in scheme.parameters():  # away from the initial values, which may be round numbers
            p.add_(torch.rand_like(p) * 0.1)
        scheme.constrain_()
        x = torch.randn(2, t, 48)
        full = scheme.bias(x, t, t)  # (1 or B, H, T, T)
        rows = scheme.rows(x)
        for r0, r1 in _row_blocks(t):
            block = rows(r0, r1)
            assert block.shape == (full.shape[0], H, r1 - r0, r1)
            want = full[:, :, r0:r1, :r1]
            if name == "kerple-power":  # pow rounds differently in its SIMD body and scalar tail: 1 ulp
                torch.testing.assert_close(block, want, rtol=2.4e-7, atol=0)
            else:
                assert torch.equal(block, want)
            block.fill_(0.0)  # each call returns a new tensor: the attention may overwrite it
        assert torch.equal(rows(0, t), full) or name == "kerple-power"


@pytest.mark.parametrize(("name", "options"), [("cable", {}), ("fox", {})])
def test_context_dependent_rows_sum_over_the_input_once_per_forward(name: str, options: dict) -> None:
    scheme = get_scheme(name)(H, 48, **options)
    calls = []
    scheme.proj.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(1, 200, 48)
    with torch.no_grad():
        rows = scheme.rows(x)
        for r0, r1 in _row_blocks(200):
            rows(r0, r1)
    assert len(calls) == 1  # not once per block: that would cost O(T^2 C)
    with pytest.raises(BiasvizError, match="needs the attention input"):
        scheme.rows(None)
