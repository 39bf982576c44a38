"""CABLE: the sum of the softplus costs between key and query, input-dependent and additive along the path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from biasviz.common.errors import BiasvizError
from biasviz.schemes import get_scheme
from tests.properties import SETTINGS, _causal, heads, seeds
from tests.schemes.scheme_biases import H, _bias, causal_cells


def test_cable_equals_sum_of_softplus_costs_between_keys_and_query() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("cable")(H, 48)
    torch.nn.init.normal_(scheme.proj.weight, std=0.3)
    torch.nn.init.normal_(scheme.proj.bias, std=0.3)
    x = torch.randn(2, 16, 48)
    with torch.no_grad():
        b = scheme(x, 16, 16).double().numpy()  # (B, H, T, T)
    w = scheme.proj.weight.detach().double().numpy()
    beta = scheme.proj.bias.detach().double().numpy()
    rates = np.log1p(np.exp(x.double().numpy() @ w.T + beta))  # softplus, (B, T, H)
    for bi in range(2):
        for i in range(16):
            for j in range(i + 1):
                expected = -rates[bi, j + 1 : i + 1].sum(axis=0)  # sum over k = j+1..i
                np.testing.assert_allclose(b[bi, :, i, j], expected, rtol=1e-5, atol=1e-5)


def test_cable_is_path_additive_and_input_dependent() -> None:
    torch.manual_seed(1)
    scheme = get_scheme("cable")(H, 48)
    torch.nn.init.normal_(scheme.proj.weight, std=0.3)
    x = torch.randn(2, 24, 48)
    with torch.no_grad():
        b = scheme(x, 24, 24).double().numpy()
    for i, k, j in [(23, 10, 0), (15, 15, 3), (9, 4, 4), (20, 7, 6)]:
        np.testing.assert_allclose(b[:, :, i, j], b[:, :, i, k] + b[:, :, k, j], rtol=1e-6, atol=1e-5)
    mask = causal_cells(24) & ~np.eye(24, dtype=bool)
    assert np.abs(b[0][:, mask] - b[1][:, mask]).max() > 1e-2  # two inputs, two different biases
    assert (b[:, :, mask] < 0).all()  # softplus > 0: every off-diagonal causal cell is a penalty


def test_cable_needs_the_input() -> None:
    with pytest.raises(BiasvizError, match="depends on the input"):
        get_scheme("cable")(H, 48)(None, 4, 4)


@SETTINGS
@given(h=heads, t=st.integers(2, 64), seed=seeds)
def test_cable_is_a_difference_of_cumulative_costs(h: int, t: int, seed: int) -> None:
    out = _bias("cable", h, t, 1, seed)[0].numpy()  # (H, T, T)
    cells = _causal(t)
    assert (out[:, cells] <= 1e-6).all()  # -sum of softplus values: never positive
    # b(i, j) = b(i, 0) - b(j, 0): additive along the path, as s_i - s_j is
    np.testing.assert_allclose(out, out[:, :, :1] - out[:, :, :1].transpose(0, 2, 1), atol=1e-4)
