"""docs/position-measures.md's ``frequency_use`` (biasviz.summaries.frequency) in summaries: per head the mean norm of
each rotary pair of q and of k over samples and positions, and its standard error, against float64 math from the q
and k caught at the model's own attention call: our rope scheme's half-split pairs (full and partial) and GPT-J's
interleaved pairs, through SDPA (rows formed again) and eager attention (streamed)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import biasviz
from biasviz.store.reader import open_bias_file
from tests.conftest import small_model
from tests.summaries.test_weight_measures_models import N, hooked_qk, interleaved_rotary, profile_se


def _pair_norms(x: np.ndarray, pairs: list[tuple[int, int]], rotated: int) -> np.ndarray:
    """(N, H, T, hd) -> (N, H, pairs [+ 1]): the mean over positions of each pair's norm, the rest's norm last."""
    cols = [np.hypot(x[..., a], x[..., b]).mean(-1) for a, b in pairs]
    if x.shape[-1] > rotated:
        cols.append(np.sqrt((x[..., rotated:] ** 2).sum(-1)).mean(-1))
    return np.stack(cols, -1)



def _check_frequency_use(path: Path, layer: int, q: np.ndarray, k: np.ndarray, pairs: list, rotated: int) -> None:
    f = open_bias_file(path)
    use = f.summary_array("frequency_use", layer)
    se = f.summary_array("frequency_use_se", layer)
    for o, x in enumerate((q, k)):
        per_sample = _pair_norms(x, pairs, rotated)
        n = len(per_sample)
        np.testing.assert_allclose(use[o], per_sample.mean(0), rtol=1e-5, atol=1e-7)
        jack = np.sqrt(((per_sample - per_sample.mean(0)) ** 2).sum(0) / (n * (n - 1)))
        np.testing.assert_allclose(se[o], jack, rtol=1e-4, atol=1e-7)



@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_frequency_use_of_our_rotary_model(tmp_path: Path, fraction: float) -> None:
    """Half-split pairs (f, f + d_rot/2) of the rope scheme, full and partial (the unrotated dims one last row)."""
    model = small_model("rope", scheme_options={"fraction": fraction})
    ids = np.random.default_rng(5).integers(0, 97, size=(N, 24))
    q, k = hooked_qk(model, 0, ids)
    rotated = int(model.blocks[0].attn.pos_bias.rotary_dim)
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[0], summary=True, device="cpu", progress=False)
    half = rotated // 2
    _check_frequency_use(out, 0, q, k, [(f, f + half) for f in range(half)], rotated)



@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_frequency_use_of_an_interleaved_rotary_model(tmp_path: Path, attention: str) -> None:
    """GPT-J pairs (2f, 2f + 1) over its rotary_dim, the rest unrotated; through SDPA (formed again) and eager
    attention (streamed), against the q and k caught at its SDPA call."""
    model, ids, call = interleaved_rotary(0, 20, 3)
    model.set_attn_implementation(attention)
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, summary=True, progress=False)
    _check_frequency_use(out, 0, call["q"].numpy(), call["k"].numpy(), [(2 * f, 2 * f + 1) for f in range(2)], 4)
    q, k = call["q"].numpy(), call["k"].numpy()  # a plain causal call: the scores' profile SE on both paths
    scores = float(call["scale"]) * np.einsum("nhid,nhjd->nhij", q, k)
    causal = np.tril(np.ones((1, 20, 20), bool))
    np.testing.assert_allclose(open_bias_file(out).summary_array("scores_profile_se", 0), profile_se(scores, causal),
                               rtol=2e-4, atol=1e-6)  # fmt: skip
