"""P's profile SE of biasviz's own models that add a bias, whose rows are formed again (docs/position-measures.md):
ALiBi (the same bias in every sample) and CABLE (a bias that depends on the text: each sample's enters its delete-one P
as the others' mean). The reference is the delete-one jackknife from scratch, every P_(−a) formed again in float64 from
the q, k and bias the model hands its attention (read at its hook points in a plain forward)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.model import capture
from tests.conftest import small_model
from tests.summaries.test_positional_errors import _jackknife

N, T = 4, 16


def _caught(model: torch.nn.Module, ids: np.ndarray, layer: int) -> dict[str, np.ndarray]:
    """q, k (N, H, T, hd), the call's scale and its additive part (N, H, T, T), causal cells only, from the hooks."""
    got: dict[str, torch.Tensor] = {}
    rows: list[tuple[int, torch.Tensor]] = []
    names = [f"blocks.{layer}.attn.hook_{x}" for x in ("q", "k", "bias")]

    def keep(t: torch.Tensor, name: str, row0: int) -> None:
        if name.endswith("bias"):
            rows.append((row0, t.double()))
        else:
            got[name.rsplit("_", 1)[1]] = t.double()

    with capture(model, names, keep), torch.no_grad():
        model(torch.from_numpy(ids))
    heads = got["q"].shape[2]
    added = torch.zeros(N, heads, T, T, dtype=torch.float64)
    for row0, block in rows:
        added[:, :, row0 : row0 + block.shape[-2], : block.shape[-1]] = block
    added = torch.where(torch.ones(T, T, dtype=torch.bool).tril(), added, 0.0)
    q, k = (got[x].numpy().transpose(0, 2, 1, 3) for x in ("q", "k"))
    return {"q": q, "k": k, "scale": np.asarray(float(model.blocks[layer].attn.scale)), "added": added.numpy()}


@pytest.mark.parametrize("scheme", ["alibi", "cable"])
def test_p_s_profile_se_of_our_models_that_add_a_bias(tmp_path: Path, scheme: str) -> None:
    model = small_model(scheme)
    ids = np.random.default_rng(3).integers(0, 97, size=(N, T))
    call = _caught(model, ids, 1)
    assert (call["added"] != 0).any()
    out = tmp_path / "s.h5"
    biasviz.extract(model, ids, out, layers=[1], summary=True, resolution=T // 2, device="cpu", progress=False)
    with h5py.File(out, "r") as f:
        got = f["layer_1/positional_profile_se"][()]
        assert got.shape == f["layer_1/positional_profile"].shape
    np.testing.assert_allclose(got, _jackknife(call), rtol=2e-4, atol=1e-6, equal_nan=True)
