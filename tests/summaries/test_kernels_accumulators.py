"""Every accumulator of the fused path (:func:`biasviz.summaries.kernels.layer_accumulators`: per head, per sample,
the positional logits' and the jackknife's) against ``fused_reference.accumulators``, float64 numpy with every cell
of every sample formed in full; the kernels run on the CPU under Triton's interpreter at small sizes.

Skipped where Triton is not installed (``pip install 'biasviz[gpu]'``; CI installs it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.summaries.fused_reference import accumulators, documents, formed, padded, window
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
    (3, 4, 2, 24, 24, 12, True, 16),  # grouped queries, hd padded to 32, blocks straddling tiles, T not a multiple
    (4, 2, 2, 48, 16, 32, False, 16),  # map blocks of whole tiles (a tile adds its sums; the last cut at T), no bias
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


# grouped queries (4 heads over 2 kv heads: a kernel reading k of h % 2 for h // 2 is wrong there) in CASES and
# BY_SAMPLE; every other case reads its bias for 2 heads over 1, half the programs under Triton's interpreter
MASKED = [  # N, H, Hkv, T, hd, block, bias, tile, cells
    (3, 2, 1, 40, 24, 12, True, 16, window(40, 7)),  # empty, full and partial tiles; rows of fewer than 10 keys
    (3, 2, 1, 48, 16, 32, False, 16, window(48, 20)),  # blocks of whole tiles; rows of 20 keys, their tenths by rank
    (2, 2, 2, 48, 16, 8, True, 16, documents(48, [0, 13, 30])),  # packed documents: P without the jackknife
    (4, 2, 1, 40, 16, 4, False, 32, documents(40, [0, 21])),  # the default tile
]


BY_SAMPLE = [  # N, H, Hkv, T, hd, block, bias, tile, cells (N, T, T)
    (3, 4, 2, 24, 24, 12, True, 16, padded(24, [0, 17, 5], [0, 0, 0])),  # left padding: rows with no key, empty tiles
    (2, 2, 1, 48, 16, 8, False, 16, padded(48, [0, 0], [0, 21])),  # right padding
    (3, 2, 2, 40, 16, 4, True, 32, np.stack([documents(40, [0, 21]), documents(40, [0, 9, 30]),
                                             window(40, 12)])),  # documents that differ by sample; the default tile
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "bias", "tile", "cells"), MASKED + BY_SAMPLE)
def test_masked_layer_accumulators_equal_float64_math(kernels, n: int, heads: int, kv: int, t: int, hd: int,  # noqa: F811
                                                      block: int, bias: bool, tile: int,
                                                      cells: np.ndarray) -> None:  # fmt: skip
    """One mask for every sample (T, T), or each sample's own (N, T, T): then each sample's bits and tile classes
    are its own, each cell's moments over the samples that attend it, and there is no P."""
    q, k, table = _inputs(n, heads, kv, t, hd, bias)
    scale = 1 / np.sqrt(hd)
    got = kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(),
                                     None if table is None else torch.from_numpy(table).float(), scale, block,
                                     tile=tile, cells=torch.from_numpy(cells))  # fmt: skip
    want = accumulators(q, k, table, scale, block, cells=cells)
    if cells.ndim == 3:
        assert "positional_maps" not in want
        assert np.isfinite(got["lse"].numpy()).all()  # a row with no key: lse 0, no NaN
    _check(got, want)


KEY_CASES = [  # N, H, Hkv, T, hd, block, tile, cells: none, one mask, each sample's own
    (3, 2, 1, 40, 24, 12, 16, None),  # blocks straddling tiles, hd padded; P and its jackknife
    (2, 2, 1, 48, 16, 16, 32, None),  # two samples; the default tile
    (3, 2, 2, 40, 16, 8, 16, window(40, 12)),  # a sliding window, one mask for every sample
    (3, 2, 1, 40, 16, 4, 16, padded(40, [0, 0, 11], [0, 7, 0])),  # each sample its own cells
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "tile", "cells"), KEY_CASES)
def test_a_bias_of_the_key_adds_up_as_float64_math_does(kernels, n: int, heads: int, kv: int, t: int,  # noqa: F811
                                                        hd: int, block: int, tile: int,
                                                        cells: np.ndarray | None) -> None:  # fmt: skip
    """BLOOM's bias g_h(j) = m_h·j, a row of keys (its values large, as at a long context's far keys): the scores,
    weights and P formed with it, and their sums by distance holding it, since it changes along a diagonal."""
    q, k, _ = _inputs(n, heads, kv, t, hd, False)
    g = np.outer(2.0 ** -np.arange(1, heads + 1), np.arange(t)) * 3.0  # (H, T)
    scale = 1 / np.sqrt(hd)
    from biasviz.summaries.kernels.biases import KeyBias

    got = kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(),
                                     KeyBias(torch.from_numpy(g).float()), scale, block, tile=tile,
                                     cells=None if cells is None else torch.from_numpy(cells))  # fmt: skip
    _check(got, accumulators(q, k, g, scale, block, cells=cells, keys=True))
    as_distance = accumulators(q, k, g, scale, block, cells=cells)  # the same table read as one of distance
    assert not np.allclose(as_distance["maps"], accumulators(q, k, g, scale, block, cells=cells, keys=True)["maps"])


SOFTMAX_CASES = [  # N, H, Hkv, T, hd, block, tile, softcap, sinks, bias, cells
    (3, 2, 1, 40, 24, 12, 16, 0.7, False, False, None),  # Gemma 2's cap, small: most scores far into tanh's bend
    (3, 2, 1, 40, 16, 8, 16, 50.0, False, True, window(40, 12)),  # a cap near the identity beside a bias and a window
    (3, 2, 1, 40, 24, 12, 16, None, True, False, None),  # GPT-OSS's sink columns, P and its jackknife
    (2, 2, 1, 48, 16, 16, 32, None, True, False, window(48, 9)),  # sinks beside a sliding window; the default tile
    (3, 2, 2, 40, 16, 4, 16, 0.9, True, False, padded(40, [0, 17, 5], [0, 0, 3])),  # both, each sample its own cells
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "tile", "softcap", "sinks", "bias", "cells"),
                         SOFTMAX_CASES)  # fmt: skip
def test_a_softcap_and_sink_columns_add_up_as_float64_math_does(kernels, n: int, heads: int, kv: int, t: int,  # noqa: F811
                                                                hd: int, block: int, tile: int, softcap: float | None,
                                                                sinks: bool, bias: bool,
                                                                cells: np.ndarray | None) -> None:  # fmt: skip
    """The weights are the softmax of cap·tanh(s / cap) over the keys and each row's sink logit (a padded row's sink
    alone: its weights 0); the scores, their moments, P and the jackknife stay those of s. Every accumulator against
    float64 numpy, and each of softcap and sinks changes what it touches (so the kernels cannot have left it out)."""
    q, k, table = _inputs(n, heads, kv, t, hd, bias)
    q = q * 3.0  # logits of several units: a cap of 0.7 bends them, a sink competes with them
    logits = np.random.default_rng(t + n).normal(1.5, 1.0, size=(n, t, heads)) if sinks else None
    scale = 1 / np.sqrt(hd)
    got = kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(),
                                     None if table is None else torch.from_numpy(table).float(), scale, block,
                                     tile=tile, cells=None if cells is None else torch.from_numpy(cells),
                                     softcap=softcap,
                                     sinks=None if logits is None else torch.from_numpy(logits).float())  # fmt: skip
    want = accumulators(q, k, table, scale, block, cells=cells, softcap=softcap, sinks=logits)
    _check(got, want)
    np.testing.assert_allclose(got["lse"].numpy(), formed(q, k, table, scale, cells, False, softcap, logits)[3],
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    plain = accumulators(q, k, table, scale, block, cells=cells)
    assert not np.allclose(plain["maps"][0], want["maps"][0], rtol=1e-3)  # the weights changed
    np.testing.assert_allclose(plain["maps"][2], want["maps"][2], rtol=1e-12)  # the scores did not
    if sinks:
        assert (want["sample_columns"].sum(-1) < 0.99 * got["lse"].shape[-1]).all()  # the sink took a share


def _mlp(heads: int, t: int, hidden: int, threshold: float, seed: int = 0) -> Any:
    """An :class:`MlpBias` as FIRE's ``kernel_terms`` gives one: ψ(x) = log(c x + 1), c = 0.5, threshold L, random
    weights of the size a trained FIRE has."""
    from biasviz.summaries.kernels.biases import MlpBias

    g = torch.Generator().manual_seed(seed)
    c = torch.tensor(0.5)
    positions = torch.arange(t, dtype=torch.float32)
    return MlpBias(torch.log1p(c * positions), torch.log1p(c * positions.clamp(min=threshold)),
                   torch.randn(hidden, generator=g), torch.randn(hidden, generator=g),
                   torch.randn(heads, hidden, generator=g) * 0.5, torch.randn(heads, generator=g))  # fmt: skip


MLP_CASES = [  # N, H, Hkv, T, hd, block, tile, threshold, hidden, cells
    (3, 2, 1, 40, 24, 12, 16, 8.0, 8, None),  # rows past L = 8 interpolate by their own ψ(i); P and its jackknife
    (2, 2, 1, 48, 16, 16, 32, 100.0, 32, None),  # L past T: a function of i - j alone, still formed cell by cell
    (3, 2, 2, 40, 16, 8, 16, 4.0, 8, window(40, 12)),  # a sliding window, one mask for every sample
    (3, 2, 1, 40, 16, 4, 16, 4.0, 8, padded(40, [0, 0, 11], [0, 7, 0])),  # each sample its own cells
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "tile", "threshold", "hidden", "cells"), MLP_CASES)
def test_fire_s_mlp_formed_in_each_tile_adds_up_as_float64_math_does(kernels, n: int, heads: int, kv: int,  # noqa: F811
                                                                     t: int, hd: int, block: int, tile: int,
                                                                     threshold: float, hidden: int,
                                                                     cells: np.ndarray | None) -> None:  # fmt: skip
    """FIRE's bias b_h(i, j), its MLP run on ψ(i - j) / ψ(max(L, i)) in each tile: the scores, weights and P formed with
    it, and the sums by distance holding it (it changes along a diagonal past L)."""
    from tests.summaries.fused_reference import mlp_cells

    q, k, _ = _inputs(n, heads, kv, t, hd, False)
    mlp = _mlp(heads, t, hidden, threshold)
    cells_b = mlp_cells(mlp, t)
    scale = 1 / np.sqrt(hd)
    got = kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(), mlp, scale, block,
                                     tile=tile, cells=None if cells is None else torch.from_numpy(cells))  # fmt: skip
    _check(got, accumulators(q, k, cells_b, scale, block, cells=cells))
    i, j = np.indices((t, t))
    along = cells_b[:, i - j == 3]  # one diagonal: constant while every row is below L, not past it
    assert (np.ptp(along, -1) > 1e-3).all() == (threshold < t)


CELL_CASES = [  # N, H, Hkv, T, hd, block, tile, per head, cells
    (3, 2, 1, 40, 24, 12, 16, True, None),  # a table a head; P and its jackknife
    (2, 2, 1, 48, 16, 16, 32, False, None),  # one table for every head; the default tile
    (3, 2, 2, 40, 16, 8, 16, True, window(40, 12)),  # a sliding window, one mask for every sample
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "tile", "per_head", "cells"), CELL_CASES)
def test_a_bias_read_cell_by_cell_adds_up_as_float64_math_does(kernels, n: int, heads: int, kv: int, t: int,  # noqa: F811
                                                               hd: int, block: int, tile: int, per_head: bool,
                                                               cells: np.ndarray | None) -> None:  # fmt: skip
    """A bias of each cell, neither a table of distance nor a row of keys (-m log(1 + i - j)·(1 + i / T), as a traced
    call's float mask may hold one), NaN above the diagonal as a forward keeps it: read in each tile, the sums by
    distance holding it."""
    from biasviz.summaries.kernels.biases import CellBias

    q, k, _ = _inputs(n, heads, kv, t, hd, False)
    i, j = np.indices((t, t))
    slopes = 2.0 ** -np.arange(1, (heads if per_head else 1) + 1)
    b = -slopes[:, None, None] * np.log1p(np.clip(i - j, 0, None)) * (1 + i / t)
    held = torch.from_numpy(np.where(j <= i, b, np.nan)).float()
    scale = 1 / np.sqrt(hd)
    got = kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(), CellBias(held), scale,
                                     block, tile=tile,
                                     cells=None if cells is None else torch.from_numpy(cells))  # fmt: skip
    full = np.broadcast_to(held.double().nan_to_num().numpy(), (heads, t, t)).copy()
    _check(got, accumulators(q, k, full, scale, block, cells=cells))


ENDS_CASES = [  # N, H, Hkv, T, hd, block, tile
    (3, 2, 1, 40, 24, 12, 16),  # P and its jackknife, blocks that split tiles unevenly
    (4, 2, 1, 48, 16, 16, 32),  # the default tile, blocks of whole tiles
    (2, 2, 2, 40, 16, 8, 16),  # two samples: P without its jackknife
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "tile"), ENDS_CASES)
def test_a_bias_of_each_sample_s_own_adds_up_as_float64_math_does(kernels, n: int, heads: int, kv: int,  # noqa: F811
                                                                   t: int, hd: int, block: int,
                                                                   tile: int) -> None:  # fmt: skip
    """CABLE's bias, e_a(i) - e_a(j) with e_a each sample's own cumulative cost (-Σ softplus, large at far positions):
    the scores, weights, their moments over samples and the sums by distance holding it; P with the samples' mean bias,
    and the jackknife with each one's (- N b_a). A kernel that took every sample's bias for the first's, or P's b̄ for
    0, is off by far more than float32's rounding."""
    from biasviz.summaries.kernels.biases import SampleEnds

    q, k, _ = _inputs(n, heads, kv, t, hd, False)
    rates = np.log1p(np.exp(np.random.default_rng(t).normal(size=(n, heads, t))))  # softplus: a cost a position
    ends = -np.cumsum(rates, -1)
    held = torch.from_numpy(ends).float()
    cells = (held[..., :, None] - held[..., None, :]).double().numpy()  # the model's fp32 operands and difference
    scale = 1 / np.sqrt(hd)
    got = kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(), SampleEnds(held),
                                     scale, block, tile=tile)  # fmt: skip
    want = accumulators(q, k, np.tril(cells), scale, block)
    _check(got, want)
    first_only = accumulators(q, k, np.broadcast_to(np.tril(cells[:1]), cells.shape).copy(), scale, block)
    assert not np.allclose(first_only["sample_blocks"], want["sample_blocks"], rtol=1e-3)


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "tile", "left", "right"), [
    (3, 2, 1, 40, 24, 12, 16, [0, 9, 4], [0, 0, 0]),  # left padding, as BLOOM's positions start after it
    (3, 2, 1, 48, 16, 16, 32, [2, 0, 11], [0, 5, 0]),  # both sides, the default tile
])  # fmt: skip
def test_a_row_of_keys_of_each_sample_s_own_adds_up_as_float64_math_does(kernels, n: int, heads: int, kv: int,  # noqa: F811
                                                                          t: int, hd: int, block: int, tile: int,
                                                                          left: list[int],
                                                                          right: list[int]) -> None:  # fmt: skip
    """BLOOM's bias beside padding, g_a(j) = m·(j - pad_a) over each sample's own cells (NaN on its padded keys, as
    the bank holds it): each sample's scores and weights with its own bias, each cell's moments over the samples that
    attend it. Reading the first sample's row for every sample is off by far more than float32's rounding."""
    from biasviz.summaries.kernels.biases import SampleKeys

    q, k, _ = _inputs(n, heads, kv, t, hd, False)
    cells = padded(t, left, right)
    j = np.arange(t)
    slopes = 2.0 ** -np.arange(1, heads + 1)
    g = np.stack([slopes[:, None] * np.where((j >= lo) & (j < t - hi), j - lo, np.nan)[None]
                  for lo, hi in zip(left, right, strict=True)])  # (N, H, T)
    scale = 1 / np.sqrt(hd)
    got = kernels.layer_accumulators(torch.from_numpy(q).float(), torch.from_numpy(k).float(),
                                     SampleKeys(torch.from_numpy(g).float()), scale, block, tile=tile,
                                     cells=torch.from_numpy(cells))  # fmt: skip
    own = np.broadcast_to(np.nan_to_num(g)[:, :, None, :], (n, heads, t, t)).copy()
    want = accumulators(q, k, own, scale, block, cells=cells)
    _check(got, want)
    first = accumulators(q, k, np.broadcast_to(own[:1], own.shape).copy(), scale, block, cells=cells)
    assert not np.allclose(first["sample_blocks"], want["sample_blocks"], rtol=1e-3)
