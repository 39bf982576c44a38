"""KERPLE's log and power forms against their definitions, parameters clamped to their ranges."""

from __future__ import annotations

import numpy as np
import torch

from biasviz.schemes import get_scheme
from tests.schemes.scheme_biases import H, T, causal_cells, causal_distance


def test_kerple_log_form() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("kerple-log")(H, 48)
    with torch.no_grad():
        scheme.r1.copy_(torch.linspace(0.005, 3.0, H))  # first head below the 0.01 floor
        scheme.r2.copy_(torch.linspace(2.0, 0.001, H))
        b = scheme(None, T, T)[0].double().numpy()
    r1 = np.maximum(np.linspace(0.005, 3.0, H), 0.01)
    r2 = np.maximum(np.linspace(2.0, 0.001, H), 0.01)
    d = np.clip(causal_distance(T), 0, None)
    mask = causal_cells(T)
    for h in range(H):
        np.testing.assert_allclose(b[h][mask], (-r1[h] * np.log(1 + r2[h] * d))[mask], rtol=1e-5, atol=1e-6)


def test_kerple_power_form_and_range() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("kerple-power")(H, 48)
    with torch.no_grad():
        scheme.r1.copy_(torch.linspace(0.001, 2.0, H))
        scheme.r2.copy_(torch.linspace(0.0, 3.0, H))  # outside (0, 2] at both ends
        b = scheme(None, T, T)[0].double().numpy()
    r1 = np.maximum(np.linspace(0.001, 2.0, H), 0.01)
    r2 = np.clip(np.linspace(0.0, 3.0, H), 0.01, 2.0)
    d = np.clip(causal_distance(T), 0, None)
    mask = causal_cells(T)
    for h in range(H):
        np.testing.assert_allclose(b[h][mask], (-r1[h] * d ** r2[h])[mask], rtol=1e-5, atol=1e-6)


def test_kerple_power_has_finite_gradients_at_distance_zero() -> None:
    scheme = get_scheme("kerple-power")(H, 48)
    scheme(None, 8, 8).sum().backward()
    assert torch.isfinite(scheme.r1.grad).all() and torch.isfinite(scheme.r2.grad).all()
