"""FoX: the sum of log forget gates between key and query; its bias-only gate is an ALiBi, its fixed one follows
the decay times."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.common.errors import BiasvizError
from biasviz.schemes import get_scheme
from tests.schemes.scheme_biases import H


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.log1p(np.exp(-z))


def test_fox_is_the_sum_of_log_forget_gates_between_j_and_i() -> None:
    t, c = 9, 48
    scheme = get_scheme("fox")(H, c)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        scheme.proj.weight.copy_(torch.randn(H, c, generator=g) * 0.3)
        scheme.proj.bias.copy_(torch.randn(H, generator=g))
    x = torch.randn(2, t, c, generator=g)
    got = scheme(x, t, t).detach().double().numpy()  # (B, H, T, T)
    z = x.double().numpy() @ scheme.proj.weight.double().detach().numpy().T + scheme.proj.bias.double().detach().numpy()
    for b in range(2):
        for h in range(H):
            for i in range(t):
                for j in range(i + 1):  # sum over k = j+1 .. i, straight from the definition
                    want = sum(_log_sigmoid(z[b, k, h]) for k in range(j + 1, i + 1))
                    assert got[b, h, i, j] == pytest.approx(want, abs=1e-5)
    cable = get_scheme("cable")(H, c)  # the same family: -softplus(z) = log sigmoid(-z)
    with torch.no_grad():
        cable.proj.weight.copy_(-scheme.proj.weight)
        cable.proj.bias.copy_(-scheme.proj.bias)
    np.testing.assert_allclose(cable(x, t, t).detach().numpy(), got, atol=1e-5)


def test_fox_bias_only_gate_is_an_alibi_and_fixed_follows_the_decay_times() -> None:
    t = 16
    only = get_scheme("fox")(H, 48, gate="bias_only")
    with torch.no_grad():
        only.gate_bias.copy_(torch.linspace(-1.0, 4.0, H))
    slopes = -_log_sigmoid(np.linspace(-1.0, 4.0, H))
    i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    want = -slopes[:, None, None] * (i - j)
    cells = j <= i
    np.testing.assert_allclose(only(None, t, t)[0].detach().numpy()[:, cells], want[:, cells], rtol=1e-5, atol=1e-5)
    assert not only.depends_on_input and get_scheme("fox")(H, 48).depends_on_input
    fixed = get_scheme("fox")(H, 48, gate="fixed", decay_time_min=2.0, decay_time_max=512.0)
    times = -1.0 / _log_sigmoid(fixed.gate_bias.double().detach().numpy())
    np.testing.assert_allclose(times, np.geomspace(2.0, 512.0, H), rtol=1e-5)  # float32 parameters
    assert not any(p.requires_grad for p in fixed.parameters())  # fixed: nothing to learn
    with pytest.raises(BiasvizError, match="needs decay_time_min"):
        get_scheme("fox")(H, 48, gate="fixed")
    with pytest.raises(BiasvizError, match="unknown FoX gate"):
        get_scheme("fox")(H, 48, gate="sometimes")
