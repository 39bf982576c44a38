"""CABLE: context-aware additive biases from the tokens between i and j (Veisi et al.)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from biasviz.common.errors import BiasvizError
from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme, ScoreTerms


@register
class CABLE(PositionScheme):
    """b_h(i, j) = s_i - s_j with s_t = -sum_{k<=t} softplus(w_h . x_k + beta_h).

    Each token k adds a non-negative, input-dependent cost to every distance that spans it, so
    the bias decreases with distance (like ALiBi) but at a rate set by the content in between.
    """

    name = "cable"

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        self.proj = nn.Linear(d_model, n_head)  # w_h, beta_h

    def reset_parameters(self) -> None:
        nn.init.normal_(self.proj.weight, std=0.02)
        nn.init.zeros_(self.proj.bias)

    def cumulative_cost(self, x: torch.Tensor | None) -> torch.Tensor:
        """s_t for every position: (B, H, T); computed in float32 for long sequences."""
        if x is None:
            raise BiasvizError("the CABLE bias depends on the input: it needs the attention input x")
        rates = F.softplus(self.proj(x).float())  # (B, T, H)
        return -torch.cumsum(rates, dim=1).transpose(1, 2)  # (B, H, T)

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        s = self.cumulative_cost(x)  # (B, H, Tk)
        s_q = s[:, :, k_len - q_len :]  # (B, H, Tq)
        return s_q[:, :, :, None] - s[:, :, None, :]  # (B, H, Tq, Tk)

    def score_terms(self, x: torch.Tensor | None) -> ScoreTerms:
        """b_h(i, j) = s_i - s_j from one cumulative sum per forward (per block of rows it would cost O(T * C))."""
        return ScoreTerms(ends=self.cumulative_cost(x))
