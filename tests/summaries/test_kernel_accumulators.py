"""Every accumulator of the fused path (:func:`biasviz.summaries.kernels.layer_accumulators`: per head, per sample,
the positional logits' and the jackknife's) against ``fused_reference.accumulators``, float64 numpy with every cell
of every sample formed in full; the kernels run on the CPU under Triton's interpreter at small sizes.

Skipped where Triton is not installed (``pip install 'biasviz[gpu]'``; CI installs it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.summaries.fused_reference import accumulators
from tests.summaries.test_kernels import kernels  # noqa: F401  (the fixture)

pytest.importorskip("triton")


def _inputs(n: int, heads: int, kv: int, t: int, hd: int, bias: bool) -> tuple:
    """q (N, H, T, hd), k (N, H_kv, T, hd) float64 and an ALiBi-like table f_h(d) = -slope_h d (or None)."""
    rng = np.random.default_rng(n * 1000 + heads * 100 + t)
    q, k = rng.normal(size=(n, heads, t, hd)), rng.normal(size=(n, kv, t, hd))
    table = -np.outer(2.0 ** -np.arange(1, heads + 1), np.arange(t)) if bias else None
    return q, k, table


def _run(kernels, q: np.ndarray, k: np.ndarray, table: np.ndarray | None, scale: float, block: int,  # noqa: F811
         positional: bool, tile: int = 16) -> dict:  # fmt: skip
    return kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(),
                                      None if table is None else torch.from_numpy(table).float(), scale, block,
                                      positional=positional, tile=tile)  # fmt: skip


def _check(got: dict, want: dict) -> None:
    """The same names (and ``lse``), shapes, float64, and values to float32's rounding of the array's largest."""
    assert set(got) == {*want, "lse"}
    for name, ref in want.items():
        assert got[name].dtype == torch.float64, name
        value = got[name].cpu().numpy()
        assert value.shape == ref.shape, name
        scale = max(np.abs(ref).max(), 1e-30)
        np.testing.assert_allclose(value, ref, rtol=2e-4, atol=2e-5 * scale, err_msg=name)


CASES = [  # N, H, Hkv, T, hd, block, bias, tile
    (3, 4, 2, 40, 24, 12, True, 16),  # grouped queries, hd padded to 32, blocks straddling tiles, T not a multiple
    (4, 2, 2, 64, 16, 32, False, 16),  # map blocks of whole tiles (a tile adds its sums), no bias
    (2, 2, 1, 40, 24, 32, True, 16),  # two samples: P without the jackknife; whole-tile blocks cut at T
    (1, 2, 2, 24, 16, 12, True, 16),  # one sample: neither P nor the jackknife
    (3, 2, 1, 40, 16, 32, True, 32),  # the default tile
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "bias", "tile"), CASES)
def test_layer_accumulators_equal_float64_math(kernels, n: int, heads: int, kv: int, t: int, hd: int,  # noqa: F811
                                               block: int, bias: bool, tile: int) -> None:  # fmt: skip
    q, k, table = _inputs(n, heads, kv, t, hd, bias)
    scale = 1 / np.sqrt(hd)
    got = _run(kernels, q, k, table, scale, block, positional=True, tile=tile)
    want = accumulators(q, k, table, scale, block)
    assert ("positional_maps" in want, "jackknife_blocks" in want) == (n >= 2, n >= 3)
    _check(got, want)


def test_without_positional_only_the_per_head_and_per_sample_sums(kernels) -> None:  # noqa: F811
    q, k, table = _inputs(3, 2, 1, 24, 16, True)
    got = _run(kernels, q, k, table, 0.25, 8, positional=False)
    _check(got, accumulators(q, k, table, 0.25, 8, positional=False))


def test_layer_accumulators_keep_what_fused_statistics_finishes(kernels) -> None:  # noqa: F811
    """The five sums :func:`finish` takes are the same tensors as :func:`tile_sums` gives."""
    q, k, _ = _inputs(2, 2, 2, 24, 16, False)
    q, k = torch.from_numpy(q).float(), torch.from_numpy(k).float()
    got = kernels.layer_accumulators(q, k, None, 0.25, 8, tile=16)
    sums = kernels.tile_sums(q, k, None, got["lse"], 0.25, 8, tile=16)
    for name, value in zip(("maps", "by_distance", "columns", "row_ws", "sinks"), sums, strict=True):
        torch.testing.assert_close(value, got[name], msg=name)
