"""A relative bias computed once for the whole batch (MPNet's ``compute_position_bias``: one (H, T, T) of the
positions, expanded to the batch and added to every sample's scores) is each sample's additive part: traced in
batches of one, two and all, the stored bias is the model's own tensor for every sample, and the weights are the
model's own eager ``output_attentions``."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz

T, N, HEADS = 12, 4, 4


@pytest.mark.parametrize("batch", [1, 2, N])
def test_a_batch_shared_relative_bias_is_every_sample_s(tmp_path: Path, batch: int) -> None:
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(0)
    config = MPNetConfig(hidden_size=32, num_attention_heads=HEADS, num_hidden_layers=1, intermediate_size=64,
                         vocab_size=64, max_position_embeddings=64)  # fmt: skip
    model = MPNetModel(config).eval()
    ids = torch.randint(3, 64, (N, T), generator=torch.Generator().manual_seed(4))
    kept: list[torch.Tensor] = []
    original = model.encoder.compute_position_bias

    def caught(x, *args, **kwargs):  # noqa: ANN001, ANN202
        bias = original(x, *args, **kwargs)
        kept.append(bias.detach().clone())
        return bias

    model.encoder.compute_position_bias = caught
    try:
        with torch.no_grad():
            own = model(ids, output_attentions=True).attentions[0].double().numpy()  # (N, H, T, T)
    finally:
        model.encoder.compute_position_bias = original
    bias = torch.broadcast_to(kept[0][:1], (N, HEADS, T, T)).double().numpy()  # one for every sample
    out = tmp_path / "m.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, batch_size=batch, progress=False)
    with h5py.File(out, "r") as f:
        np.testing.assert_allclose(f["layer_0/weights"][()], own, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(f["layer_0/bias"][()], bias, rtol=1e-5, atol=1e-6)
