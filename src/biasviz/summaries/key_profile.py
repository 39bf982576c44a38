"""docs/positional.md's key profile: the weights by key, a reducer named by the table of datasets.

Per head and key j, the mean and spread of the weights over samples and the queries that see j (i >= j when causal;
every query otherwise): Gu et al.'s α_j and its spread. Both follow from two sums by key, Σ_i w̄ and Σ_i (σ² + w̄²),
and each equals a sum over samples, Σ_a Σ_i w_a / N and Σ_a Σ_i w_a² / N. So a block of every sample's per-cell
moments (rows formed again over all samples at once) adds once what each sample's rows (streamed, or masked by sample)
would add N times (:attr:`~biasviz.summaries.reducers.Reducer.moments`). The queries are counted from the cells each
block brings (its own, the call's one mask's rows, or none: the causal triangle, or every cell), so that nothing is
set on it beforehand or switched part-way.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.common.shapes import step_cells
from biasviz.store.datasets import KEY_PROFILE
from biasviz.summaries.reducers import Reducer

# cells of per-cell moments squared in float64 at a time on a CPU (16 MiB, mean and spread; a chunk holds 4x as many); a
# GPU's step (:func:`~biasviz.common.shapes.step_cells`) holds a whole chunk: one pass of kernels
WIDE_CELLS = 1 << 20


class KeyProfile(Reducer):
    """Σ_i w̄ and Σ_i (σ² + w̄²) by head and key over every sample, and the queries that see each key. Not kept per
    sample: under torchrun each process's sums are added (:meth:`join`). Its additions are not held: it takes each
    sample's rows only where no block waits on a bias's comparison (streamed, or samples masked differently), and a
    block's moments only once the block stands. On the fused path, the kernels' own finish of the same column sums
    (:meth:`Reducer.from_kernels`)."""

    rows = (KEY_PROFILE,)
    moments = True

    def __init__(self, **sizes: Any) -> None:
        super().__init__(**sizes)
        self.sums["columns"] = torch.zeros(2, self.heads, self.seq_len, dtype=torch.float64, device=self.device)
        # the queries that see each key (1 or H, T), whole numbers: of the blocks of per-cell moments (one for every
        # sample), and summed over the samples of blocks of each sample's weights (divided by N at the end); blocks
        # that bring no cells, counted by their first row's block (a pass of the rule's own counts each)
        self.joint: torch.Tensor | None = None
        self.per_sample: torch.Tensor | None = None
        self.joint_plain, self.sample_plain = 0, 0

    def _count(self, name: str, cells: torch.Tensor, times: int) -> None:
        """The queries of ``cells`` (1 or B, 1 or H, rows, K) that see each key, ``times`` over, into ``name``."""
        counts = cells.sum(-2, dtype=torch.float64)  # (1 or B, 1 or H, K)
        counts = counts.sum(0) if counts.shape[0] > 1 or times == 1 else counts[0] * times
        total = getattr(self, name)
        if total is None or total.shape[0] < counts.shape[0]:
            wider = torch.zeros(counts.shape[0], self.seq_len, dtype=torch.float64, device=self.device)
            total = wider if total is None else wider + total
        total[:, : counts.shape[-1]] += counts.to(total.device)
        setattr(self, name, total)

    def add(self, block: RowBlock) -> None:
        """Samples' own weights (B, H, rows, K), 0 where a query does not see a key, over the block's cells (None: the
        call's rule): the same sums, since Σ_i w̄ = Σ_a Σ_i w_a / N and Σ_i (σ² + w̄²) = Σ_a Σ_i w_a² / N."""
        weights = block.weights
        keys = weights.shape[-1]
        sums = self.sums["columns"]
        wide = weights.to(torch.float64, copy=True)  # squared in float64 (see add_moments), the caller's left be
        sums[0, :, :keys] += wide.sum(2).sum(0) / self.total
        sums[1, :, :keys] += wide.square_().sum(2).sum(0) / self.total
        if block.attended is not None:
            self._count("per_sample", block.attended, weights.shape[0])
        elif block.r0 == 0:
            self.sample_plain += weights.shape[0]

    def add_moments(self, r0: int, values: torch.Tensor, cells: torch.Tensor | None) -> None:
        """A block's per-cell mean and spread of the weights over every sample (2, H, rows, K) of rows ``r0 ..``, 0
        where a query does not see a key, over ``cells`` (1, 1 or H, rows, K; None: the call's rule).

        Squared and summed in float64: the spread over queries is sqrt(Σ (σ² + w̄²) / n - mean²), and a float32 square's
        rounding would leave a key that one query sees (the last) a spread of about sqrt(6e-8) of its weight, not 0."""
        heads, rows, keys = values.shape[1:]
        sums = self.sums["columns"]
        step = max(1, step_cells(values.device, WIDE_CELLS) // max(1, heads * keys))  # rows a float64 copy at a time
        for r in range(0, rows, step):
            wide = values[:, :, r : r + step].to(torch.float64, copy=True)  # squared in place: the caller's left be
            sums[0, :, :keys] += wide[0].sum(1)
            sums[1, :, :keys] += wide.square_().sum(2).sum(0)  # Σ over rows of w̄² + σ²; an axis at a time
        if cells is not None:
            self._count("joint", cells, 1)
        elif r0 == 0:
            self.joint_plain += 1

    def state(self) -> dict[str, torch.Tensor]:
        """The sums and the per-sample blocks' counts, on the CPU (torchrun: added up on process 0 by :meth:`join`)."""
        counted = torch.zeros(1, self.seq_len, dtype=torch.float64) if self.per_sample is None else self.per_sample
        return {"sums": self.sums["columns"].cpu(), "per_sample": counted.cpu(),
                "plain": torch.tensor([self.sample_plain])}  # fmt: skip

    def join(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Every process's :meth:`state`: their samples' sums and counts added up."""
        self.sums["columns"] = sum(s["sums"] for s in states).to(self.device)
        self.per_sample = sum(s["per_sample"] for s in states).to(self.device)
        self.sample_plain = int(sum(int(s["plain"]) for s in states))

    def _rule(self) -> torch.Tensor:
        """(T,) float64: the queries of the call's rule that see each key, T - j causal, T otherwise."""
        if self.causal:
            return torch.arange(self.seq_len, 0, -1, dtype=torch.float64, device=self.device)
        return torch.full((self.seq_len,), float(self.seq_len), dtype=torch.float64, device=self.device)

    def widen(self) -> None:
        """Blocks that brought no cells were counted by the causal rule: counted as their cells now, before the rule
        becomes every key."""
        rule = self._rule()
        if self.joint_plain:
            self.joint = self.joint_plain * rule[None] if self.joint is None else self.joint + self.joint_plain * rule
        if self.sample_plain:
            counted = self.sample_plain * rule[None]
            self.per_sample = counted if self.per_sample is None else self.per_sample + counted
        self.joint_plain = self.sample_plain = 0
        super().widen()

    def profile(self) -> torch.Tensor:
        """(2, H, T) float32 on the device: mean and standard deviation by key (NaN where no query sees it)."""
        sums = self.sums["columns"]
        rule = self._rule().to(sums.device)
        joint = self.joint_plain * rule if self.joint is None else self.joint + self.joint_plain * rule
        by_sample = self.sample_plain * rule if self.per_sample is None else self.per_sample + self.sample_plain * rule
        queries = joint + by_sample / self.total
        mean = sums[0] / queries
        var = (sums[1] / queries - mean * mean).clamp(min=0.0)
        out = torch.stack([mean, var.sqrt()])
        return torch.where(queries > 0, out, float("nan")).float()

    def result(self) -> dict[str, np.ndarray]:
        return {KEY_PROFILE: self.profile().cpu().numpy()}
