"""Standard errors of the block maps (docs/position-measures.md), against float64 math from what the model computed:
each sample's q, k, bias and weights read at its hook points and in a full extract (not through a summary). The maps of
the bias, weights and scores: the spread of each sample's block mean; P's: the delete-one jackknife, P formed again from
scratch with each sample left out."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.store.reader import open_bias_file
from tests.conftest import small_model
from tests.measures_reference import block_means, map_se
from tests.summaries.test_position import _positional, _reference, _windows


def jackknife_p(r: dict[str, np.ndarray], mask: np.ndarray, block: int) -> np.ndarray:
    """(H, nb, nb): √((N - 1)/N Σ_a (θ_(−a) − mean θ)²), θ_(−a) the block means of P of the other N - 1 samples."""
    n = r["q"].shape[0]
    thetas = []
    for a in range(n):
        keep = [b for b in range(n) if b != a]
        thetas.append(block_means(_positional({**r, **{x: r[x][keep] for x in ("q", "k", "bias")}})[None], mask,
                                  block)[0])  # fmt: skip
    th = np.stack(thetas)
    return np.sqrt((n - 1) / n * ((th - th.mean(0)) ** 2).sum(0))


@pytest.mark.parametrize("scheme", ["rope", "cable", "alibi"])
def test_map_errors_of_a_replayed_model(tmp_path: Path, scheme: str) -> None:
    """Our models (rows formed again): the weights', scores' and bias' map SEs and P's jackknife, with blocks of
    several positions (each sample's block sums carried) and of one (from the stored spread; P's per cell)."""
    model = small_model(scheme)
    ids = _windows(n=4)
    t = ids.shape[1]
    r = _reference(model, ids, tmp_path, layer=1)
    mask = np.tril(np.ones((1, t, t), bool))
    bias = np.nan_to_num(r["bias"])
    scores = r["scale"] * np.einsum("nhid,nhjd->nhij", r["q"], r["k"]) + bias
    for resolution in (t // 3, t):
        out = tmp_path / f"s{resolution}.h5"
        biasviz.extract(model, ids, out, layers=[1], summary=True, resolution=resolution, device="cpu",
                        progress=False)  # fmt: skip
        f = open_bias_file(out)
        b = f.block
        p = _positional(r)
        with h5py.File(out) as raw:  # the reference's P is the file's
            np.testing.assert_allclose(raw["layer_1/positional_mean"][()], block_means(p[None], mask, b)[0],
                                       rtol=1e-4, atol=1e-5, equal_nan=True)  # fmt: skip
        np.testing.assert_allclose(f.summary_array("positional_mean_se", 1), jackknife_p(r, mask, b), rtol=1e-3,
                                   atol=1e-6, equal_nan=True, err_msg=f"P, block {b}")  # fmt: skip
        for kind, values in (("weights", r["weights"]), ("scores", scores), ("bias", bias)):
            if kind == "bias" and scheme == "rope":
                continue
            np.testing.assert_allclose(f.summary_array(f"{kind}_mean_se", 1), map_se(values, mask, b), rtol=2e-4,
                                       atol=2e-6, equal_nan=True, err_msg=f"{kind}, block {b}")  # fmt: skip


def test_p_jackknife_equal_whether_key_blocks_are_kept_or_summed_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Past KEY_BLOCKS_BYTES every sample's key-block sums are formed again for each block of rows instead of kept:
    the same jackknife either way, against the one from scratch."""
    from biasviz.summaries import positional_blocks

    model = small_model("rope")
    ids = _windows(n=4)
    t = ids.shape[1]
    r = _reference(model, ids, tmp_path, layer=1)
    mask = np.tril(np.ones((1, t, t), bool))
    got, kept = {}, positional_blocks.KEY_BLOCKS_BYTES
    for limit in (kept, 0):
        monkeypatch.setattr(positional_blocks, "KEY_BLOCKS_BYTES", limit)
        out = tmp_path / f"s{limit}.h5"
        biasviz.extract(model, ids, out, layers=[1], summary=True, resolution=t // 3, device="cpu", progress=False)
        got[limit] = open_bias_file(out).summary_array("positional_mean_se", 1)
        b = open_bias_file(out).block
    np.testing.assert_allclose(got[0], jackknife_p(r, mask, b), rtol=1e-3, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got[0], got[kept], rtol=1e-6, equal_nan=True)
