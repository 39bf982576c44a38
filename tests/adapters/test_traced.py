"""A model traced call by call (:mod:`biasviz.adapters.traced`)."""

from __future__ import annotations

import torch

from tests.adapters.test_adapters import H, L, T, ids
from tests.conftest import small_model


def test_a_traced_biasviz_model_makes_one_call_per_layer_at_blocked_lengths(monkeypatch):
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.extraction.full_matrices import full_matrices
    from biasviz.model.modeling import Attention

    monkeypatch.setattr(Attention, "block_elements", 24 * 60)  # our own forward: many blocks of rows
    model = small_model("alibi")
    x = torch.as_tensor(ids(2))
    traced = TracedAdapter(model, scheme="alibi")
    traced.prepare(x.numpy())
    assert traced.n_layers == L  # call L is layer L, not one call per block
    with full_matrices(traced, [1]) as got:
        traced.forward(x)
    assert got.weights[1].shape == (2, H, T, T)
    assert all("block_elements" not in a.__dict__ for a in (b.attn for b in model.blocks))  # restored
    hooked = BiasGPTAdapter(model, source="t")
    with full_matrices(hooked, [1]) as ours:
        hooked.forward(x)
    torch.testing.assert_close(got.weights[1], ours.weights[1], rtol=0, atol=1e-6)
