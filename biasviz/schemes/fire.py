"""FIRE: an MLP of the progressively interpolated distance (Li et al., ICLR 2024)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme, option_int, option_number, query_positions, relative_distance

MIN_C = 1e-4  # psi(x) = log(c x + 1) needs c > 0
MIN_THRESHOLD = 1.0  # psi(max(L, i)) must stay > 0 at i = 0


@register
class FIRE(PositionScheme):
    """b_h(i, j) = f_theta(psi(d) / psi(max(L, i)))_h with psi(x) = log(c x + 1).

    The input of the MLP lies in [0, 1] whatever the length, which is what lets FIRE extrapolate.
    """

    name = "fire"

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        hidden = int(self.options["hidden"])
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_head))
        self.c = nn.Parameter(torch.empty(()))
        self.threshold = nn.Parameter(torch.empty(()))  # L
        self.reset_parameters()

    @classmethod
    def _check(cls, options: dict[str, Any], n_head: int) -> None:
        option_int("fire", "hidden", options["hidden"], 1)
        option_number("fire", "init_c", options["init_c"], positive=True)
        option_number("fire", "init_threshold", options["init_threshold"])

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.c.fill_(float(self.options["init_c"]))
            self.threshold.fill_(float(self.options["init_threshold"]))
            for layer in (self.mlp[0], self.mlp[2]):
                layer.reset_parameters()

    def _params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.c.clamp(min=MIN_C), self.threshold.clamp(min=MIN_THRESHOLD)

    @torch.no_grad()
    def constrain_(self) -> None:
        c, L = self._params()
        self.c.copy_(c)
        self.threshold.copy_(L)

    def normalized_distance(self, q_len: int, k_len: int) -> torch.Tensor:
        """The MLP's input psi(d) / psi(max(L, i)), (Tq, Tk); d clamped at 0 above the diagonal."""
        c, L = self._params()
        dev = self.c.device
        d = relative_distance(q_len, k_len, dev).clamp(min=0).to(c.dtype)
        i = query_positions(q_len, k_len, dev).to(c.dtype)
        return torch.log1p(c * d) / torch.log1p(c * torch.maximum(i, L))

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        u = self.normalized_distance(q_len, k_len)  # (Tq, Tk)
        out = self.mlp(u[..., None])  # (Tq, Tk, H)
        return out.permute(2, 0, 1)[None]  # (1, H, Tq, Tk)
