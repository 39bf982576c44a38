"""ALiBi: a fixed linear penalty -m_h * (i - j) per head (Press, Smith & Lewis, ICLR 2022)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from biasviz.common.errors import BiasvizError
from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme, relative_distance


def geometric_slopes(n_head: int) -> list[float]:
    """m_h = 2^(-8h/H) for h = 1..H: a geometric sequence from 2^(-8/H) down to 2^-8.

    >>> [round(m, 6) for m in geometric_slopes(8)]
    [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.007812, 0.003906]
    >>> round(geometric_slopes(12)[0], 6), geometric_slopes(12)[-1]
    (0.629961, 0.00390625)
    """
    return [2.0 ** (-8.0 * h / n_head) for h in range(1, n_head + 1)]


def interleaved_slopes(n_head: int) -> list[float]:
    """Press et al.'s rule for any H (the one BLOOM uses).

    Take the geometric slopes of the largest power of two P <= H; when H > P, append every other
    slope of the 2P-head sequence (its odd-numbered ones) until there are H.

    >>> [round(m, 4) for m in interleaved_slopes(12)][8:]
    [0.7071, 0.3536, 0.1768, 0.0884]
    """
    p = 2 ** int(math.floor(math.log2(n_head)))
    slopes = geometric_slopes(p)
    if p < n_head:
        slopes += geometric_slopes(2 * p)[0::2][: n_head - p]
    return slopes


@register
class ALiBi(PositionScheme):
    """Fixed, non-learned slopes; the bias depends on the distance alone."""

    name = "alibi"

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        # persistent, so a checkpoint records exactly the slopes it was trained with
        self.register_buffer("slopes", torch.tensor(self.resolve_slopes(self.options["slopes"], n_head)))

    @classmethod
    def _check(cls, options: dict[str, Any], n_head: int) -> None:
        cls.resolve_slopes(options["slopes"], n_head)

    @staticmethod
    def resolve_slopes(spec: str | Sequence[float], n_head: int) -> list[float]:
        """Slopes from a rule name (``geometric``, ``interleaved``) or an explicit list of finite numbers."""
        if isinstance(spec, str):
            rules = {"geometric": geometric_slopes, "interleaved": interleaved_slopes}
            if spec not in rules:
                raise BiasvizError(f"unknown ALiBi slope rule '{spec}'; use geometric, interleaved or a list")
            return rules[spec](n_head)
        finite = isinstance(spec, (list, tuple)) and all(
            isinstance(m, (int, float)) and not isinstance(m, bool) and math.isfinite(m) for m in spec
        )
        if not finite:
            raise BiasvizError("alibi option 'slopes' must be geometric, interleaved or a list of finite numbers "
                               "(one per head)")  # fmt: skip
        slopes = [float(m) for m in spec]
        if len(slopes) != n_head:
            raise BiasvizError(f"ALiBi needs one slope per head: got {len(slopes)} for {n_head} heads")
        return slopes

    def reset_parameters(self) -> None:
        self.slopes.copy_(torch.tensor(self.resolve_slopes(self.options["slopes"], self.n_head)))

    def distance_bias(self, d: torch.Tensor) -> torch.Tensor:
        slopes = self.slopes.view(-1, *(1,) * d.dim())  # (H, 1, ...)
        return -slopes * d.to(self.slopes.dtype)  # (H, *d.shape)

    def score_formula(self) -> tuple[Callable[..., torch.Tensor], tuple[torch.Tensor, ...]]:
        return alibi_value, (self.slopes,)

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        return self.distance_bias(relative_distance(q_len, k_len, self.slopes.device))[None]  # (1, H, Tq, Tk)


def alibi_value(params: tuple[torch.Tensor, ...], h: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """-m_h d, cell by cell (:meth:`ALiBi.score_formula`): :meth:`ALiBi.distance_bias`'s arithmetic."""
    (slopes,) = params
    return -slopes[h] * d.to(slopes.dtype)
