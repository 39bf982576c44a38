"""Which tensors come from the model's parameters alone (:mod:`biasviz.tracing.provenance`): a learned table that holds
zeros is a bias, a mask of zeros built from the input is not."""

from __future__ import annotations

import torch

import biasviz
from tests.tracing.test_eager_reshapes import D, H, T


# --- through a trace -----------------------------------------------------------------------------------------------
class ZeroTable(torch.nn.Module):
    """A learned per-head, per-distance table that holds zeros, handed to SDPA as its float mask."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(H, 2 * T - 1))

    def forward(self, q: torch.Tensor, k: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        i = torch.arange(T)
        bias = self.table[:, i[:, None] - i[None, :] + T - 1]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=bias)
        zero_mask = torch.zeros(q.shape[0], 1, 1, T).masked_fill(~padding[:, None, None, :], float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=zero_mask) + out


def test_a_zero_learned_table_is_a_bias_and_a_zero_padding_mask_is_not() -> None:
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(2, H, T, D, generator=g) for _ in range(2))
    model = ZeroTable()
    with torch.no_grad(), biasviz.trace(model) as t:
        model(q, k, torch.ones(2, T, dtype=torch.bool))
    assert t.calls[0].adds_bias and torch.equal(t.bias[0], torch.zeros(1, H, T, T))
    assert not t.calls[1].adds_bias and 1 not in t.bias  # built from the input: a mask with nothing masked
