"""RoPE: q and k rotated pairwise by angles proportional to their position (Su et al., RoFormer, 2021).

GPT-NeoX's half-split layout, as transformers' Llama, GPT-NeoX, Qwen and Mistral use it: dimension f of the
first half of the rotated dimensions is paired with dimension f + d_rot/2, and the pair at position p turns
by p·θ_f, θ_f = base^(-2f/d_rot), f = 0 .. d_rot/2 - 1. Only the first d_rot = fraction·d_head dimensions
turn (GPT-NeoX's ``rotary_pct``, Phi's partial rotary); the rest pass unchanged. No term is added to the
scores: the position shows in the positional logits (docs/positional.md), not in a bias.
"""

from __future__ import annotations

from typing import Any

import torch

from biasviz.common.errors import BiasvizError
from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme, option_number


@register
class RoPE(PositionScheme):
    """Rotary position embedding applied to each head's q and k; adds no bias."""

    name = "rope"
    rotary = True

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        head_dim = d_model // n_head
        rot = int(round(self.options["fraction"] * head_dim))
        self.rotary_dim = rot - rot % 2
        if self.rotary_dim < 2:
            raise BiasvizError(f"rope: fraction {self.options['fraction']} of a head of {head_dim} dimensions turns "
                               "fewer than 2 dimensions; use a larger fraction")  # fmt: skip

    @classmethod
    def _check(cls, options: dict[str, Any], n_head: int) -> None:
        option_number(cls.name, "base", options["base"], positive=True)
        fraction = option_number(cls.name, "fraction", options["fraction"], positive=True)
        if fraction > 1:
            raise BiasvizError(f"rope option 'fraction' must be in (0, 1], not {fraction!r}")

    def frequencies(self, device: torch.device | None = None) -> torch.Tensor:
        """θ_f, f = 0 .. d_rot/2 - 1, in float64 (the angles are formed in float64, then cast)."""
        f = torch.arange(0, self.rotary_dim, 2, dtype=torch.float64, device=device)
        return float(self.options["base"]) ** (-f / self.rotary_dim)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin of p·θ_f, each (len(positions), d_rot), the frequencies repeated for both halves."""
        angles = positions.to(torch.float64)[:, None] * self.frequencies(positions.device)[None, :]
        angles = torch.cat([angles, angles], dim=-1)  # (T, d_rot)
        return angles.cos().to(dtype), angles.sin().to(dtype)

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q and k (B, T, H, hd), positions 0 .. T-1, rotated: new tensors of the same shape."""
        T = q.shape[1]
        cos, sin = self.cos_sin(torch.arange(T, device=q.device), q.dtype)  # (T, d_rot)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, d_rot)
        return self._turn(q, cos, sin), self._turn(k, cos, sin)

    def _turn(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        d = self.rotary_dim
        turned, rest = x[..., :d], x[..., d:]
        half = d // 2
        swapped = torch.cat([-turned[..., half:], turned[..., :half]], dim=-1)  # the pair partner, sign for sin
        return torch.cat([turned * cos + swapped * sin, rest], dim=-1)
