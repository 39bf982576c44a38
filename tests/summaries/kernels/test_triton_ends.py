"""K3 (:mod:`biasviz.summaries.kernels.triton_ends`): the summary of a bias of each sample's own, e_a(i) - e_a(j)
(CABLE's, FoX's), against float64 numpy from every cell of every sample formed in full; run on the CPU under Triton's
interpreter at small sizes.

Skipped where Triton is not installed (``pip install 'biasviz[gpu]'``; CI installs it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.kernels import ends_sums
from biasviz.summaries.kernels.biases import SampleEnds
from tests.summaries.fused_reference import own_bias_sums


def _cells(e: np.ndarray) -> np.ndarray:
    """(N, H, T, T) float64 b_a(i, j) = e_a(i) - e_a(j)."""
    return e[..., :, None] - e[..., None, :]


def _check(got: dict, want: dict, spread_scale: float | None = None) -> None:
    assert set(got) == set(want)
    for name, ref in want.items():
        value = got[name].numpy()
        assert got[name].dtype == torch.float64 and value.shape == ref.shape, name
        scale = max(np.abs(ref).max(), 1e-30) if spread_scale is None or name == "bias_shifted" else spread_scale
        np.testing.assert_allclose(value, ref, rtol=2e-4, atol=2e-5 * scale, err_msg=name)


CASES = [  # N, H, T, block, tile
    (3, 2, 40, 12, 16),  # blocks straddling tiles, T not a multiple of either
    (2, 3, 48, 16, 16),  # a tile a block
    (4, 2, 40, 4, 16),  # blocks splitting each tile
    (3, 1, 64, 32, 32),  # the default tile
    (2, 2, 33, 40, 16),  # one block past T
]


@pytest.mark.parametrize(("n", "heads", "t", "block", "tile"), CASES)
def test_k3_s_sums_equal_float64_math(interpreter, n: int, heads: int, t: int, block: int, tile: int) -> None:
    e = -np.random.default_rng(n * 100 + t).random((n, heads, t)).cumsum(-1).astype(np.float32)  # a gate's log sums
    got = ends_sums(SampleEnds(torch.from_numpy(e)), block, tile)
    want = own_bias_sums(_cells(e.astype(np.float64)), np.tril(np.ones((t, t), dtype=bool)), block)
    _check(got, want)


def test_samples_that_differ_little_on_large_ends_keep_their_spread(interpreter) -> None:
    """Ends of ~300 whose samples differ by ~1e-3 (a long sequence's cumulative sums): each cell's spread is that of
    the small centred values, as float64 takes it, not float32's rounding of e (~3e-5 a value) swelling it; samples
    that agree exactly have a spread of exactly 0."""
    rng = np.random.default_rng(7)
    base = -rng.random((1, 2, 48)).cumsum(-1) * 12.0
    e = (base + 1e-3 * rng.normal(size=(3, 2, 48))).astype(np.float32)
    got = ends_sums(SampleEnds(torch.from_numpy(e)), 16, 16)
    cells = _cells(e.astype(np.float64))
    used = np.tril(np.ones((48, 48), dtype=bool))
    want = own_bias_sums(cells, used, 16)
    np.testing.assert_allclose(got["bias_spread"].numpy(), want["bias_spread"], rtol=1e-4)
    np.testing.assert_allclose(got["bias_distance"][2].numpy(), want["bias_distance"][2], rtol=1e-3, atol=1e-12)
    np.testing.assert_allclose(got["bias_maps"][1].numpy(), want["bias_maps"][1], rtol=1e-4, atol=1e-12)
    agree = ends_sums(SampleEnds(torch.from_numpy(np.repeat(e[:1], 3, 0))), 16, 16)
    assert (agree["bias_spread"] == 0).all() and (agree["bias_distance"][2] == 0).all()
    assert (agree["bias_maps"][1] == 0).all()
