"""The fused statistics kernels (:mod:`biasviz.summaries.kernels`), run on the CPU by Triton's interpreter at small
sizes, against float64 numpy math from the same q, k and bias: every cell's scores and weights formed in full, their
mean and spread over samples per cell, then block means, sums by distance and by key. And against the torch path:
a summary of our own model written by ``extract --summary``, from the q and k its hooks hand its attention call.

Skipped where Triton is not installed (``pip install 'biasviz[gpu]'``; CI installs it).
"""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("triton")


@pytest.fixture
def kernels():  # noqa: ANN201
    """The package, its kernels interpreted on the CPU (tests/conftest.py sets TRITON_INTERPRET before Triton is
    imported) or compiled for a GPU."""
    import biasviz.summaries.kernels as package

    if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
        pytest.skip("Triton's interpreter was not chosen before Triton was imported")
    return package


def _reference(q: np.ndarray, k: np.ndarray, table: np.ndarray | None, scale: float, block: int) -> dict:
    """float64 numpy: q (N, H, T, hd), k (N, Hkv, T, hd), table (H, T) f(d) or None."""
    n, heads, t, _ = q.shape
    k = np.repeat(k, heads // k.shape[1], axis=1)
    i, j = np.indices((t, t))
    used = j <= i
    s = scale * np.einsum("nhid,nhjd->nhij", q, k)
    if table is not None:
        s = s + table[:, np.clip(i - j, 0, None)][None]
    z = np.where(used, s, -np.inf)
    lse = np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1)) + z.max(-1)
    w = np.where(used, np.exp(z - lse[..., None]), 0.0)
    s = np.where(used, s, 0.0)
    nb = -(-t // block)
    out = {}
    for name, x in (("weights", w), ("scores", s)):
        mean, std = x.mean(0), x.std(0)
        for stat, v in (("mean", mean), ("std", std)):
            m = np.full((heads, nb, nb), np.nan)
            for a in range(nb):
                for b in range(nb):
                    cells = used[a * block : (a + 1) * block, b * block : (b + 1) * block]
                    if cells.any():
                        m[:, a, b] = v[:, a * block : (a + 1) * block, b * block : (b + 1) * block][:, cells].mean(-1)
            out[f"{name}_{stat}"] = m
        d = i - j
        prof = np.zeros((2, heads, t))
        for dist in range(t):
            on = d == dist
            cells_mean, cells_var = mean[:, on], std[:, on] ** 2
            prof[0, :, dist] = cells_mean.mean(-1)
            prof[1, :, dist] = np.sqrt(cells_var.mean(-1) + cells_mean.var(-1))  # within + between the cells
        out[f"{name}_profile"] = prof
    seen_by = used.sum(0)  # queries that see key j
    w_mean, w_std = w.mean(0), w.std(0)
    key_mean = w_mean.sum(1) / seen_by
    out["weights_key_profile"] = np.stack([key_mean, np.sqrt((w_std**2 + w_mean**2).sum(1) / seen_by - key_mean**2)])
    out["sink_share"] = w[..., 0].sum(-1) / t
    out["row_entropy"] = -(np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0)).sum(-1)
    return out


def _check(got: dict, want: dict) -> None:
    for name, ref in want.items():
        value = got[name].double().cpu().numpy()
        assert value.shape == ref.shape, name
        scale = np.nanmax(np.abs(ref)) if np.isfinite(ref).any() else 1.0
        np.testing.assert_allclose(value, ref, rtol=2e-4, atol=2e-5 * scale, equal_nan=True, err_msg=name)


CASES = [  # N, H, Hkv, T, hd, block, bias, tile
    (3, 2, 2, 40, 16, 4, True, 16),  # a tile straddles map blocks; T not a multiple of the tile
    (2, 4, 2, 33, 12, 5, False, 16),  # grouped queries, no bias, hd padded to 16, uneven blocks
    (4, 1, 1, 64, 32, 32, True, 16),  # map blocks of whole tiles (each tile adds its sums)
    (1, 2, 1, 17, 16, 1, True, 16),  # one sample (no spread), maps exact per cell
]


@pytest.mark.parametrize(("n", "heads", "kv", "t", "hd", "block", "bias", "tile"), CASES)
def test_fused_statistics_equal_float64_math(kernels, n: int, heads: int, kv: int, t: int, hd: int, block: int,
                                             bias: bool, tile: int) -> None:  # fmt: skip
    rng = np.random.default_rng(n * 100 + t)
    q, k = rng.normal(size=(n, heads, t, hd)), rng.normal(size=(n, kv, t, hd))
    table = -np.cumsum(rng.uniform(0, 0.5, size=(heads, t)), -1) if bias else None
    scale = 1 / np.sqrt(hd)
    got = kernels.fused_statistics(torch.from_numpy(q).float(), torch.from_numpy(k).float(),
                                   None if table is None else torch.from_numpy(table).float(), scale, block,
                                   tile=tile)  # fmt: skip
    _check(got, _reference(q, k, table, scale, block))


def test_a_key_one_query_sees_has_no_spread_over_queries(kernels) -> None:
    """The last key is seen by one query: with one sample its weight's spread over queries is exactly 0 (its square
    and its mean's square formed alike, in fp64). Squared in float32, it was sqrt(6e-8) of the weight: 6e-5 at 0.43."""
    rng = np.random.default_rng(117)
    q, k = (torch.from_numpy(rng.normal(size=(1, 2, 17, 16))).float() for _ in range(2))
    table = torch.from_numpy(-np.cumsum(rng.uniform(0, 0.5, size=(2, 17)), -1)).float()
    got = kernels.fused_statistics(q, k, table, 0.25, 1, tile=16)["weights_key_profile"]
    assert (got[0, :, -1] > 0.05).all()  # a weight whose float32 square rounds
    assert got[1, :, -1].tolist() == [0.0, 0.0]
    # each sample's own cells (one sample, padded after 3 positions): its weights' columns, Σ w and Σ w², meet alike
    cells = torch.ones(1, 17, 17, dtype=torch.bool).tril_()
    cells[:, 14:], cells[:, :, 14:] = False, False
    columns = kernels.layer_accumulators(q, k, table, 0.25, 1, tile=16, cells=cells)["columns"]
    last = columns[:, :, 13]  # key 13: seen by query 13 alone
    assert (last[0] > 0.05).all() and torch.equal(last[1], last[0] * last[0])


def test_q_and_k_in_any_layout(kernels) -> None:
    """Strides are the kernels' arguments: (N, T, H, hd) storage, as a model's projection leaves it, gives the same."""
    rng = np.random.default_rng(5)
    q, k = (torch.from_numpy(rng.normal(size=(2, 24, 2, 16))).float() for _ in range(2))
    a = kernels.fused_statistics(q.transpose(1, 2), k.transpose(1, 2), None, 0.25, 4, tile=16)
    b = kernels.fused_statistics(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(), None, 0.25, 4, tile=16)
    for name in a:
        torch.testing.assert_close(a[name], b[name], equal_nan=True)


@pytest.mark.parametrize("scheme", ["alibi", "rope"])
def test_fused_statistics_equal_the_torch_paths_summary(kernels, tmp_path: Path, scheme: str) -> None:
    """The same layer summarised by the torch path (rows formed again) and by the kernels from the q, k and f(d) of
    the model's own attention call: every dataset both give."""
    import biasviz
    from biasviz.summaries.toeplitz import distance_values
    from tests.conftest import small_model
    from tests.summaries.test_weight_measures_models import hooked_qk

    model = small_model(scheme, n_head=4)
    ids = np.random.default_rng(2).integers(0, 97, size=(3, 32))
    layer, block = 1, 4
    biasviz.extract(model, ids, tmp_path / "s.h5", layers=[layer], summary=True, resolution=8, device="cpu",
                    progress=False)  # fmt: skip
    q, k = hooked_qk(model, layer, ids)
    attn = model.blocks[layer].attn
    table = distance_values(attn.pos_bias, 32) if scheme != "rope" else None
    got = kernels.fused_statistics(torch.from_numpy(q).float(), torch.from_numpy(k).float(), table,
                                   float(attn.scale), block, tile=16)  # fmt: skip
    with h5py.File(tmp_path / "s.h5") as f:
        g = f[f"layer_{layer}"]
        assert f.attrs["block"] == block
        compared = [name for name in got if name in g]
        assert {"weights_mean", "weights_std", "scores_mean", "weights_profile", "sink_share"} <= set(compared)
        for name in compared:
            want = g[name][()]
            value = got[name].cpu().numpy()
            if name == "sink_share" and want.ndim == 1:  # the file's mean over samples
                value = value.mean(0)
            scale = np.nanmax(np.abs(want))  # float32 sums of both: a spread is exact to the mean's rounding
            np.testing.assert_allclose(value, want, rtol=2e-4, atol=2e-5 * scale, equal_nan=True, err_msg=name)
