"""KERPLE: kernelized relative biases, logarithmic and power variants (Chi et al., NeurIPS 2022)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme, relative_distance

MIN_PARAM = 0.01  # r1, r2 are kept >= 0.01 (KERPLE clamps its parameters the same way)
MAX_POWER = 2.0  # the power variant needs 0 < r2 <= 2 for a conditionally positive definite kernel


class _Kerple(PositionScheme):
    """Two positive parameters per head, r1 (scale) and r2 (shape), learned."""

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        self.r1 = nn.Parameter(torch.empty(n_head))
        self.r2 = nn.Parameter(torch.empty(n_head))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            # spread heads over an order of magnitude so that they start out different
            self.r1.copy_(torch.logspace(0.3, -0.7, self.n_head))
            self.r2.copy_(torch.logspace(0.0, -1.0, self.n_head))

    def _params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.r1.clamp(min=MIN_PARAM), self.r2.clamp(min=MIN_PARAM)

    @torch.no_grad()
    def constrain_(self) -> None:
        r1, r2 = self._params()
        self.r1.copy_(r1)
        self.r2.copy_(r2)

    def _distance(self, d: torch.Tensor) -> torch.Tensor:
        # clamp j > i cells to 0: they are masked anyway, and must not produce NaN gradients
        return d.clamp(min=0).to(self.r1.dtype)

    def _per_head(self, p: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        return p.view(-1, *(1,) * d.dim())  # (H, 1, ...)

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        return self.distance_bias(relative_distance(q_len, k_len, self.r1.device))[None]  # (1, H, Tq, Tk)


@register
class KerpleLog(_Kerple):
    name = "kerple-log"

    def distance_bias(self, d: torch.Tensor) -> torch.Tensor:
        r1, r2 = self._params()
        d = self._distance(d)
        return -self._per_head(r1, d) * torch.log1p(self._per_head(r2, d) * d)  # (H, *d.shape)

    def score_formula(self) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
        return kerple_log_value, self._params()


@register
class KerplePower(_Kerple):
    name = "kerple-power"

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.r1.copy_(torch.logspace(0.0, -1.5, self.n_head))
            self.r2.copy_(torch.linspace(1.0, 0.5, self.n_head))

    def _params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.r1.clamp(min=MIN_PARAM), self.r2.clamp(min=MIN_PARAM, max=MAX_POWER)

    def distance_bias(self, d: torch.Tensor) -> torch.Tensor:
        r1, r2 = self._params()
        d = self._distance(d)
        return -self._per_head(r1, d) * d.pow(self._per_head(r2, d))  # (H, *d.shape)

    def score_formula(self) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
        return kerple_power_value, self._params()


def kerple_log_value(params: tuple[torch.Tensor, ...], h: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """-r1_h log(1 + r2_h d), cell by cell: :meth:`KerpleLog.distance_bias`'s arithmetic (d clamped at 0 as there)."""
    r1, r2 = params
    d = d.clamp(min=0).to(r1.dtype)
    return -r1[h] * torch.log1p(r2[h] * d)


def kerple_power_value(params: tuple[torch.Tensor, ...], h: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """-r1_h d^r2_h, cell by cell: :meth:`KerplePower.distance_bias`'s arithmetic."""
    r1, r2 = params
    d = d.clamp(min=0).to(r1.dtype)
    return -r1[h] * d.pow(r2[h])
