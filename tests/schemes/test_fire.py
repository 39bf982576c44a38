"""FIRE: an MLP of the progressive interpolation of the distance, computed independently."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.schemes import get_scheme
from tests.schemes.scheme_biases import H, T, causal_cells, causal_distance


def _fire_reference(scheme: torch.nn.Module, t: int) -> np.ndarray:
    c = float(scheme.c.detach())
    big_l = float(scheme.threshold.detach())
    d = np.clip(causal_distance(t), 0, None)
    i = np.arange(t, dtype=np.float64)[:, None]
    u = np.log(c * d + 1) / np.log(c * np.maximum(big_l, i) + 1)  # (T, T) in [0, 1]
    w1, b1 = scheme.mlp[0].weight.detach().double().numpy(), scheme.mlp[0].bias.detach().double().numpy()
    w2, b2 = scheme.mlp[2].weight.detach().double().numpy(), scheme.mlp[2].bias.detach().double().numpy()
    hidden = np.maximum(u[..., None] * w1[:, 0] + b1, 0)  # (T, T, hidden)
    return np.moveaxis(hidden @ w2.T + b2, -1, 0)  # (H, T, T)


@pytest.mark.parametrize("threshold", [512.0, 10.0])
def test_fire_is_mlp_of_progressive_interpolation(threshold: float) -> None:
    torch.manual_seed(0)
    scheme = get_scheme("fire")(H, 48, init_threshold=threshold)
    with torch.no_grad():
        b = scheme(None, T, T)[0].double().numpy()
    mask = causal_cells(T)
    expected = _fire_reference(scheme, T)
    for h in range(H):
        np.testing.assert_allclose(b[h][mask], expected[h][mask], rtol=1e-5, atol=1e-6)


def test_fire_diagonal_is_constant_and_input_in_unit_interval() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("fire")(H, 48, init_threshold=8.0)
    with torch.no_grad():
        b = scheme(None, 64, 64)[0].numpy()
        u = scheme.normalized_distance(64, 64).numpy()
    diag = np.stack([np.diag(b[h]) for h in range(H)])
    np.testing.assert_allclose(diag, diag[:, :1].repeat(64, axis=1), rtol=0, atol=1e-6)
    assert u[causal_cells(64)].min() >= 0 and u[causal_cells(64)].max() <= 1 + 1e-6
    # past the threshold the last row spans the whole unit interval: psi(i) / psi(i) = 1 at j = 0
    assert u[63, 0] == pytest.approx(1.0)


def test_a_gpu_s_rows_run_the_mlp_in_few_large_pieces() -> None:
    """With a GPU's shapes (forced on the CPU), a block of 256 x 1024 cells is one piece of the MLP, a few launches,
    not 16 cache-sized ones; the values are FIRE's, as float64 numpy forms them."""
    from biasviz.common.shapes import gpu_shapes
    from tests.summaries.test_replay_dispatch import Dispatched

    torch.manual_seed(0)
    t = 1024
    scheme = get_scheme("fire")(H, 48, init_threshold=512.0)
    x = torch.zeros(1, t, 48)
    spy = Dispatched()
    with gpu_shapes(), torch.no_grad():
        block = scheme.rows(x)
        with spy:
            spy.on = True
            got = block(768, 1024)
    assert spy.kernels <= 12, spy.kernels
    want = _fire_reference(scheme, t)[:, 768:]
    np.testing.assert_allclose(got[0].double().numpy(), want, rtol=1e-5, atol=1e-6)
