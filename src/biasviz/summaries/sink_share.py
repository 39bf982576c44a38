"""docs/positional.md's sink share: each sample's mean weight on key 0, a reducer named by the table of datasets.

For sample a and head h, Σ_i w_a(i, 0) over the queries that see key 0, divided by how many they are (Gu et al.
2025's sink share, per sample). The queries are counted from the cells each block brings (its own, the call's one
mask's rows, or none: every query of the block sees key 0, causal or not), so that nothing is set on it beforehand
or switched part-way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.store.datasets import SINK_SHARE
from biasviz.summaries.reducers import Reducer


class SinkShare(Reducer):
    """Per sample and head, Σ_i w_a(i, 0) and the queries that see key 0 (one count for every head until some block
    brings cells of its own by head). On the fused path, the kernels' own finish of the same sums
    (:meth:`Reducer.from_kernels`)."""

    rows = (SINK_SHARE,)

    def __init__(self, **sizes: Any) -> None:
        super().__init__(**sizes)
        self.zeros("weight", self.heads)
        self.zeros("seeing", 1)

    def add(self, block: RowBlock) -> None:
        """Samples ``block.first ..``'s weights on key 0, over the block's cells (``attended``; None: every row)."""
        at = (slice(block.first, block.first + block.samples),)
        weights = block.weights
        self._put(self.sums["weight"], at, weights[..., 0].sum(-1, dtype=torch.float64))
        if block.attended is None:  # every row of the block sees key 0
            self._put(self.sums["seeing"], at, float(weights.shape[-2]))
            return
        seen = block.attended[..., 0].sum(-1, dtype=torch.float64).to(self.device)  # (1 or B, 1 or H)
        self.sums["seeing"] = self._widened(self.sums["seeing"], seen.shape[1])
        self._put(self.sums["seeing"], at, seen)

    def join(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Every process's sums in rank order; a count kept for every head at once widened where another process's
        cells differed by head."""
        heads = max(s["seeing"].shape[1] for s in states)
        super().join([{**s, "seeing": s["seeing"].expand(-1, heads)} for s in states])

    def result(self) -> dict[str, np.ndarray]:
        """(N, H) float32: each sample's mean over the queries that see key 0 of their weight on it."""
        return {SINK_SHARE: (self.sums["weight"] / self.sums["seeing"]).float().cpu().numpy()}
