"""torch's own attention layer (``nn.MultiheadAttention``) kept by a summary's forward
(:func:`~biasviz.tracing.torch_layers.mha_operands`): q and k from its in-projection, the float ALiBi mask it adds and
each sample's key padding, formed again, not streamed whole.

The reference is float64 numpy on q and k made here from the layer's own in-projection weights, and the mask written
out here."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.extraction.one_layer import assert_as_reference, assert_same_datasets, both_ways, positions
from tests.extraction.test_summary_added_bias import SLOPES
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, reference

N, WIDTH = 3, 8


class Layer(torch.nn.Module):
    """An embedding and ``nn.MultiheadAttention`` (batch first) with -slope·(i - j) in its float mask, -inf after the
    query; ``padded``: token 0 at the start of a text is left padding (``key_padding_mask``)."""

    def __init__(self, padded: bool) -> None:
        super().__init__()
        self.padded = padded
        self.embed = torch.nn.Embedding(VOCAB, HEADS * WIDTH)
        self.attn = torch.nn.MultiheadAttention(HEADS * WIDTH, HEADS, batch_first=True)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        i, j = positions(ids.shape[1])
        mask = (-SLOPES * (i - j)).masked_fill(j > i, float("-inf")).repeat(ids.shape[0], 1, 1)  # (B·H, T, T)
        padding = (ids == 0).cumprod(-1).bool() if self.padded else None
        return self.attn(x, x, x, attn_mask=mask, key_padding_mask=padding, need_weights=False)[0].sum()


def _call(model: Layer, ids: torch.Tensor) -> dict[str, np.ndarray]:
    """q, k, scale, additive part and attended cells (N, H, T, T) of the layer's call, in float64, by hand."""
    e = HEADS * WIDTH
    with torch.no_grad():
        x = model.embed(ids).double()
        w, b = model.attn.in_proj_weight.double(), model.attn.in_proj_bias.double()
        q = (x @ w[:e].T + b[:e]).view(N, T, HEADS, WIDTH).transpose(1, 2)
        k = (x @ w[e : 2 * e].T + b[e : 2 * e]).view(N, T, HEADS, WIDTH).transpose(1, 2)
    i, j = positions(T)
    kept = (j <= i)[None, None].expand(N, HEADS, T, T)
    if model.padded:
        kept = kept & ~(ids == 0).cumprod(-1).bool()[:, None, None, :]
    added = torch.where(kept, (-SLOPES * (i - j)).double()[None], 0.0)
    return {"q": q.numpy(), "k": k.numpy(), "scale": np.asarray(WIDTH**-0.5), "kept": kept.numpy(),
            "added": added.numpy()}  # fmt: skip


@pytest.fixture(scope="module", params=[(False, 1), (True, N)], ids=lambda p: f"padded {p[0]}, batch {p[1]}")
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    padded, batch = request.param
    torch.manual_seed(0)
    model = Layer(padded).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    if padded:
        ids[0, :5], ids[2, :2] = 0, 0  # the first text padded most: its cells show part of the bias
    got = both_ways(model, ids, tmp_path_factory.mktemp("mha"), batch, T)
    return {**got, "expected": reference(_call(model, ids), 1, differ=padded)}


def test_the_layer_is_formed_again_and_nothing_is_started_again(summarised: dict[str, Any]) -> None:
    assert not summarised["went_streamed"]
    assert not [w for w in summarised["said"] if "started again" in w], summarised["said"]


@pytest.mark.parametrize("name", [*NAMES, "bias_mean", "bias_std", "bias_profile", "band_mass", "weights_entropy"])
def test_every_quantity_as_float64_math_has_it(summarised: dict[str, Any], name: str) -> None:
    if name == "attended" and name not in summarised["stored"]:
        return  # the causal triangle: no mask of its own
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


def test_formed_again_as_the_layer_streamed_whole_gives_it(summarised: dict[str, Any]) -> None:
    """Every dataset of the two ways in; streamed, the weights are torch's own (``need_weights``)."""
    assert_same_datasets(summarised["stored"], summarised["streamed"])
