"""One SDPA attention layer over an embedding, for the summaries' tests of the cells a call attends: a subclass says
which cells (:meth:`OneLayer.keep`) and with what scale (:meth:`OneLayer.scale`), from the tokens."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from tests.summaries.test_sample_cells import HEADS, VOCAB

WIDTH = 8  # per head


class OneLayer(nn.Module):
    """q, k and v of HEADS heads from one linear map of the token embeddings, attended by one SDPA call."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HEADS * WIDTH)
        self.qkv = nn.Linear(HEADS * WIDTH, 3 * HEADS * WIDTH)

    def keep(self, ids: torch.Tensor) -> torch.Tensor | None:
        """The cells attended, broadcast to (B, H, T, T) (None: every key)."""
        raise NotImplementedError

    def scale(self, ids: torch.Tensor) -> float | None:
        """What q·k is multiplied by (None: SDPA's 1/sqrt(WIDTH))."""
        return None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        parts = self.qkv(self.embed(ids)).split(HEADS * WIDTH, -1)
        q, k, v = (z.view(b, t, HEADS, WIDTH).transpose(1, 2) for z in parts)
        return nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.keep(ids),
                                                          scale=self.scale(ids)).sum()  # fmt: skip


def positions(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, 1) query and (1, T) key positions."""
    return torch.arange(t)[:, None], torch.arange(t)[None, :]


def assert_as_reference(got: np.ndarray, want: np.ndarray, name: str, rtol: float = 2e-5, atol: float = 1e-5) -> None:
    """A stored dataset against float64 math: the same shape, NaN exactly where the reference has no cell, the rest
    within ``rtol`` and ``atol``."""
    assert got.shape == want.shape and np.array_equal(np.isnan(got), np.isnan(want)), name
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)
