"""T5 relative bias: a learned scalar per (distance bucket, head) (Raffel et al., JMLR 2020)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from biasviz.common.errors import BiasvizError
from biasviz.schemes import register
from biasviz.schemes.base import PositionScheme, option_int, relative_distance


def causal_bucket(distance: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """T5's unidirectional bucket of the distance d = i - j >= 0 (negative d falls in bucket 0).

    Half the buckets hold one distance each; the other half cover [num_buckets/2, max_distance)
    logarithmically; everything farther shares the last bucket.

    >>> causal_bucket(torch.tensor([0, 1, 15, 16, 20, 127, 128, 1000])).tolist()
    [0, 1, 15, 16, 17, 31, 31, 31]
    """
    d = distance.clamp(min=0)
    max_exact = num_buckets // 2
    # log-spaced buckets; clamp d to >= 1 inside the log only to avoid log(0) in cells unused here
    scaled = torch.log(d.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (scaled * (num_buckets - max_exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(d < max_exact, d, large)


@register
class T5Bias(PositionScheme):
    name = "t5"

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        self.table = nn.Embedding(int(self.options["num_buckets"]), n_head)  # w: (buckets, H)
        self.reset_parameters()

    @classmethod
    def _check(cls, options: dict[str, Any], n_head: int) -> None:
        buckets = option_int("t5", "num_buckets", options["num_buckets"], 2)
        distance = options["max_distance"]
        if isinstance(distance, bool) or not isinstance(distance, int) or distance <= buckets // 2:
            raise BiasvizError(f"t5 option 'max_distance' must be an integer more than num_buckets / 2 "
                               f"({buckets // 2}), not {distance!r}")  # fmt: skip

    def reset_parameters(self) -> None:
        nn.init.normal_(self.table.weight, std=1.0)

    def distance_bias(self, d: torch.Tensor) -> torch.Tensor:
        buckets = causal_bucket(d, int(self.options["num_buckets"]), int(self.options["max_distance"]))
        return self.table(buckets).movedim(-1, 0)  # (H, *d.shape)

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        return self.distance_bias(relative_distance(q_len, k_len, self.table.weight.device))[None]  # (1, H, Tq, Tk)
