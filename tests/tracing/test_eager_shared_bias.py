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


@torch.no_grad()
def _mpnet_reference(model: torch.nn.Module, ids: torch.Tensor) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per layer, the bias (H, T, T) and the weights (N, H, T, T) in float64: q and k from each attention's own
    weights on the hidden states it received, the bias from the encoder's own relative-bias table and buckets."""
    encoder = model.encoder
    inputs: list[torch.Tensor] = []
    hooks = [layer.attention.attn.register_forward_pre_hook(lambda m, args, kw: inputs.append(args[0].detach()),
                                                            with_kwargs=True)
             for layer in encoder.layer]  # fmt: skip
    try:
        model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    t = ids.shape[-1]
    position = torch.arange(t)
    buckets = encoder.relative_position_bucket(position[None, :] - position[:, None], num_buckets=32)
    bias = encoder.relative_attention_bias.weight.double()[buckets].permute(2, 0, 1)  # (H, T, T)
    weights = []
    for layer, hidden in zip(encoder.layer, inputs, strict=True):
        attn = layer.attention.attn
        d = attn.attention_head_size
        x = hidden.double()
        q, k = ((x @ lin.weight.double().T + lin.bias.double()).view(*x.shape[:-1], -1, d).transpose(1, 2)
                for lin in (attn.q, attn.k))  # fmt: skip
        s = q @ k.transpose(-1, -2) / np.sqrt(d) + bias
        weights.append(torch.softmax(s, -1).numpy())
    return [bias.numpy()] * len(inputs), weights


@pytest.mark.parametrize("batch, masked", [(1, False), (2, True), (2, False)])
def test_mpnet_relative_bias_and_weights_are_exact_in_full_and_summary_files(tmp_path: Path, batch: int,
                                                                             masked: bool) -> None:  # fmt: skip
    """MPNet (two layers, two samples in batches of one or two, with or without an attention mask of ones): every
    layer's bias and weights, full and summarised at R = T, against float64 from the model's own relative-bias
    computation."""
    from transformers import MPNetConfig, MPNetModel

    torch.manual_seed(0)
    config = MPNetConfig(hidden_size=32, num_attention_heads=HEADS, num_hidden_layers=2, intermediate_size=64,
                         vocab_size=64, max_position_embeddings=64, attn_implementation="eager")  # fmt: skip
    model = MPNetModel(config).eval()
    ids = torch.randint(3, 64, (2, 16), generator=torch.Generator().manual_seed(4))
    biases, weights = _mpnet_reference(model, ids)
    forward = (lambda b: model(b, attention_mask=torch.ones_like(b))) if masked else None
    full, summary = tmp_path / "f.h5", tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, full, batch_size=batch, layers="all", forward=forward, progress=False)
        biasviz.extract(model, ids, summary, batch_size=batch, layers="all", forward=forward, progress=False,
                        summary=True)  # fmt: skip
    with h5py.File(full, "r") as f, h5py.File(summary, "r") as s:
        for layer, (bias, w) in enumerate(zip(biases, weights, strict=True)):
            np.testing.assert_allclose(f[f"layer_{layer}/weights"][()], w, rtol=1e-5, atol=1e-6)
            stored = f[f"layer_{layer}/bias"][()]
            np.testing.assert_allclose(stored, np.broadcast_to(bias, stored.shape), rtol=1e-6, atol=1e-7)
            np.testing.assert_allclose(s[f"layer_{layer}/weights_mean"][()], w.mean(0), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(s[f"layer_{layer}/bias_mean"][()], bias, rtol=1e-6, atol=1e-7)
