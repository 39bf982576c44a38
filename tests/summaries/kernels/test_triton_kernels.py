"""K1 of :mod:`biasviz.summaries.kernels.triton_kernels`: each row's log-sum-exp, formed tile by tile, against float64
numpy from every cell formed in full, for every form of bias the kernels add, every mask, a softcap and sink columns;
run on the CPU under Triton's interpreter at small sizes. (K2, which reduces the weights with it, is tested by its
accumulators: tests/summaries/test_kernels_accumulators.py.)

Skipped where Triton is not installed (``pip install 'biasviz[gpu]'``; CI installs it).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from biasviz.summaries.kernels.biases import CellBias, KeyBias, MlpBias, SampleEnds, SampleKeys
from tests.summaries.fused_reference import formed, mlp_cells, padded, window
from tests.summaries.test_kernels import kernels  # noqa: F401  (the fixture)

pytest.importorskip("triton")

N, H, HKV, T, HD = 3, 4, 2, 40, 24


def _operands(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """q (N, H, T, hd), k (N, H_kv, T, hd) float64, scores of a few units."""
    rng = np.random.default_rng(seed)
    return 3.0 * rng.normal(size=(N, H, T, HD)), rng.normal(size=(N, HKV, T, HD))


def _bias(form: str, rng: np.random.Generator) -> tuple[Any, np.ndarray | None]:
    """The bias as the kernels take it, and its cells as float64 (H, T, T) or each sample's (N, H, T, T)."""
    i, j = np.indices((T, T))
    if form == "none":
        return None, None
    if form == "distance":  # ALiBi-like f_h(d)
        f = -np.outer(2.0 ** -np.arange(1, H + 1), np.arange(T))
        return torch.from_numpy(f).float(), f[:, np.clip(i - j, 0, None)]
    if form == "keys":  # BLOOM's m_h·j
        g = np.outer(2.0 ** -np.arange(1, H + 1), np.arange(T))
        return KeyBias(torch.from_numpy(g).float()), np.broadcast_to(g[:, None, :], (H, T, T)).copy()
    if form == "cells":
        b = -np.log1p(np.clip(i - j, 0, None))[None] * (1 + i / T) * rng.random((H, 1, 1))
        return CellBias(torch.from_numpy(b).float()), b
    if form == "mlp":
        hidden = 6
        positions = torch.arange(T, dtype=torch.float32)
        weights = (rng.normal(size=hidden), rng.normal(size=hidden), rng.normal(size=(H, hidden)), rng.normal(size=H))
        mlp = MlpBias(torch.log1p(0.5 * positions), torch.log1p(0.5 * positions.clamp(min=8.0)),
                      *(torch.from_numpy(x).float() for x in weights))  # fmt: skip
        return mlp, mlp_cells(mlp, T)
    if form == "ends":  # each sample's own e(i) - e(j)
        e = -rng.random((N, H, T)).cumsum(-1).astype(np.float32)
        return SampleEnds(torch.from_numpy(e)), e[..., :, None].astype(np.float64) - e[..., None, :]
    g = rng.normal(size=(N, H, T)).astype(np.float32)  # "sample keys": each sample's own row of keys
    return SampleKeys(torch.from_numpy(g)), np.broadcast_to(g[:, :, None, :], (N, H, T, T)).astype(np.float64)


FORMS = ["none", "distance", "keys", "cells", "mlp", "ends"]
MASKS = {"causal": None, "window": window(T, 9), "each sample's own": padded(T, [0, 17, 5], [0, 0, 3])}


# a bias of each sample's own ends is summarised in causal calls with no mask of their own; every case on tiles of 16
# (T = 40: three query tiles, the last cut at T), the default tile of 32 for a table of distance under every mask
CASES = [(form, mask, 16) for form in FORMS for mask in MASKS if form != "ends" or mask == "causal"]
CASES += [("distance", mask, 32) for mask in MASKS]


@pytest.mark.parametrize(("form", "mask", "tile"), CASES)
def test_each_row_s_lse_equals_float64_math(kernels, form: str, mask: str, tile: int) -> None:  # noqa: F811
    """A row that sees no key (padding) has lse 0."""
    q, k = _operands(FORMS.index(form) * 10 + tile)
    table, cells_b = _bias(form, np.random.default_rng(tile))
    cells = MASKS[mask]
    got = kernels.row_lse(torch.from_numpy(q).float(), torch.from_numpy(k).float(), table, 0.25, tile,
                          cells=None if cells is None else torch.from_numpy(cells))  # fmt: skip
    want = formed(q, k, cells_b, 0.25, cells)[3]
    assert got.shape == (N, H, T) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    if cells is not None and cells.ndim == 3:
        assert (got[1, :, :17] == 0).all()  # sample 1's padded rows see no key


def test_each_sample_s_own_row_of_keys_beside_its_own_cells(kernels) -> None:  # noqa: F811
    q, k = _operands(99)
    table, cells_b = _bias("sample keys", np.random.default_rng(3))
    cells = MASKS["each sample's own"]
    got = kernels.row_lse(torch.from_numpy(q).float(), torch.from_numpy(k).float(), table, 0.25, 16,
                          cells=torch.from_numpy(cells))  # fmt: skip
    np.testing.assert_allclose(got.numpy(), formed(q, k, cells_b, 0.25, cells)[3], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("softcap", "sinks", "mask"), [(0.7, False, "causal"), (50.0, True, "window"),
                                                        (None, True, "each sample's own")])  # fmt: skip
def test_a_softcap_and_sink_columns_enter_each_row_s_lse(kernels, softcap: float | None, sinks: bool,  # noqa: F811
                                                         mask: str) -> None:  # fmt: skip
    q, k = _operands(5)
    logits = np.random.default_rng(6).normal(1.5, 1.0, size=(N, T, H)) if sinks else None
    cells = MASKS[mask]
    got = kernels.row_lse(torch.from_numpy(q).float(), torch.from_numpy(k).float(), None, 0.25, 16,
                          cells=None if cells is None else torch.from_numpy(cells), softcap=softcap,
                          sinks=None if logits is None else torch.from_numpy(logits).float())  # fmt: skip
    want = formed(q, k, None, 0.25, cells, softcap=softcap, sinks=logits)[3]
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(want, formed(q, k, None, 0.25, cells)[3], atol=1e-3)  # each changes the rows' lse


def test_sink_logits_are_taken_as_the_bank_holds_them_or_refused(kernels) -> None:  # noqa: F811
    """(N, T, H), any strides (a transposed view reads as the contiguous one); any other shape is refused."""
    q, k = (torch.from_numpy(x).float() for x in _operands(1))
    logits = torch.randn(N, H, T).transpose(1, 2)  # (N, T, H), not contiguous
    a = kernels.row_lse(q, k, None, 0.25, 16, sinks=logits)
    torch.testing.assert_close(a, kernels.row_lse(q, k, None, 0.25, 16, sinks=logits.contiguous()))
    with pytest.raises(ValueError, match="sink logits"):
        kernels.row_lse(q, k, None, 0.25, 16, sinks=logits.transpose(1, 2))


def test_a_cap_far_above_the_scores_bends_them_only_as_float64_s_tanh_does(kernels) -> None:  # noqa: F811
    """cap = 1000 over scores of a few units: s / cap ~ 1e-3, where 1 - e^-2x would lose three digits (6e-5 in each z
    once multiplied back by the cap); each row's lse to float32's rounding of float64's."""
    q, k = _operands(2)
    got = kernels.row_lse(torch.from_numpy(q).float(), torch.from_numpy(k).float(), None, 0.25, 16, softcap=1000.0)
    np.testing.assert_allclose(got.numpy(), formed(q, k, None, 0.25, softcap=1000.0)[3], rtol=0, atol=4e-6)
