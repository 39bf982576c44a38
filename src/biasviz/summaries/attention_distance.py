"""docs/position-measures.md's mean attention distance: how far back (or away) a head looks, one number per head.

For a sample, a head and a query i that attends some key, Σ_j w(i, j)·|i − j| over the keys it attends; averaged over
those queries, then over samples (mean and std, and the standard error from 3 samples on). The measure of Dosovitskiy
et al. 2021 (ViT, "mean attention distance"), in positions rather than pixels: a local head stays near 0, a head that
reads the whole context near T/2 or beyond, a sink head near i.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.common.shapes import step_cells
from biasviz.store.datasets import ATTENTION_DISTANCE, se_name
from biasviz.summaries.reducers import KernelSums, Reducer
from biasviz.summaries.sample_profiles import sample_stats

STEP_CELLS = 1 << 20  # cells weighted at a time on a CPU: a temporary of 4 MiB of float32, not of the block's size


class AttentionDistance(Reducer):
    """Per sample and head: Σ over queries of the weighted distance to the keys, and the queries that attend a key."""

    rows = (ATTENTION_DISTANCE,)

    def __init__(self, **sizes: Any) -> None:
        super().__init__(**sizes)
        self.zeros("distance", self.heads)
        self.zeros("queries", self.heads)

    def add(self, block: RowBlock) -> None:
        w = block.weights  # (S, H, rows, K), 0 where a query does not look
        s, h, rows, keys = w.shape
        step = max(1, step_cells(w.device, STEP_CELLS) // max(1, s * h * keys))  # rows a step: a bounded temporary
        total = torch.zeros(s, h, dtype=torch.float64, device=w.device)
        for c0 in range(0, rows, step):
            part = w[:, :, c0 : c0 + step]
            i = torch.arange(block.r0 + c0, block.r0 + c0 + part.shape[2], device=w.device)[:, None]
            d = (i - torch.arange(keys, device=w.device)[None, :]).abs().to(w.dtype)  # (rows, K), exact to 2^24
            total += (part * d).sum(-1).sum(-1, dtype=torch.float64)
        at = (slice(block.first, block.first + block.samples),)
        self._put(self.sums["distance"], at, total)
        if block.attended is None:  # causal, or every key: each query attends one at least
            looks = torch.full((1, 1), float(block.r1 - block.r0), dtype=torch.float64, device=w.device)
        else:
            looks = block.attended.any(-1).sum(-1, dtype=torch.float64)  # (1 or S, 1 or H)
        self._put(self.sums["queries"], at, looks.expand(block.samples, self.heads))

    def result(self) -> dict[str, np.ndarray]:
        return self._arrays(self.sums["distance"], self.sums["queries"])

    @classmethod
    def from_kernels(cls, sums: KernelSums) -> dict[str, np.ndarray] | None:
        """Σ_i Σ_j w(i, j)·(i - j) is Σ_d d·(the weights at distance d): the kernels' sums by distance hold it."""
        if sums.looks is None:  # the queries that look not counted: no measures asked
            return None
        d = torch.arange(sums.by_distance.shape[-1], dtype=torch.float64, device=sums.by_distance.device)
        distance = (sums.by_distance * d).sum(-1)  # (N, H)
        return cls._arrays(distance, sums.looks.sum(-1).expand_as(distance))

    @staticmethod
    def _arrays(distance: torch.Tensor, queries: torch.Tensor) -> dict[str, np.ndarray]:
        """(N, H) per-sample sums of the weighted distance and the queries that look -> the stored arrays."""
        per_sample = torch.where(queries > 0, distance / queries.clamp(min=1), float("nan"))  # (N, H)
        stats, se = sample_stats(per_sample)
        out = {ATTENTION_DISTANCE: stats.float().cpu().numpy()}
        if se is not None:
            out[se_name(ATTENTION_DISTANCE)] = se.float().cpu().numpy()
        return out
