"""docs/positional.md in a summary: positional logits P from the sums of q and k, and what a layer holds of it.

P(i, j) = c·(Q(i)·K(j) − G(i, j)) / (N(N − 1)) + b̄(i, j), Q = Σ_a q_a, K = Σ_a k_a, G = Σ_a q_a(i)·k_a(j): the
score a query of one text gives a key of another, averaged over pairs of different texts. Since
c·G(i, j) = N·(s̄(i, j) − b̄(i, j)) with s̄ and b̄ the per-cell means over samples of the scores and the bias,
a block of P needs only Q and K (H, T, d_head, summed once per layer) and the block's mean scores and bias,
which the summary forms anyway: one (rows x d_head) by (d_head x keys) product per head and block, not
per sample. The key profile and the sink share are reducers (:mod:`~biasviz.summaries.key_profile`,
:mod:`~biasviz.summaries.sink_share`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from biasviz.store.format import POSITIONAL_FROM_KEYS
from biasviz.summaries.attended import Attended
from biasviz.summaries.layer import QuantitySummary
from biasviz.summaries.scratch import Scratch

FIRST_KEYS = POSITIONAL_FROM_KEYS[1]  # the profile is also kept past the first keys: sinks and a shared BOS sit there


@dataclass
class PositionSummary:
    """What a file keeps of docs/positional.md for one layer (besides the scores' own maps and profile)."""

    positional_mean: np.ndarray | None  # (H, nb, nb) block means of P; None with one sample
    positional_profile: np.ndarray | None  # (2, H, T) P by distance: over all keys, over keys j >= 4
    positional_diagnostics: np.ndarray | None  # (H,) Toeplitz and separability residuals of P (docs/diagnostics.md)
    # docs/positional.md's rows of the table that its reducers give, by name: the key profile (2, H, T), the weights by
    # key j, mean and std over samples and the queries that see j (biasviz.summaries.key_profile); the sink share
    # (N, H), each sample's mean over queries of w(i, 0) (biasviz.summaries.sink_share)
    reduced: dict[str, np.ndarray]
    # (H, nb, nb) share of attended cells per block, where not causal (docs/hdf5.md, 'Attended cells')
    attended: np.ndarray | None = None
    note: str | None = None  # what the layer's summary leaves out, and why (masks that differ by sample)
    measures: dict[str, np.ndarray] | None = None  # docs/position-measures.md: name -> array (biasviz.store.datasets)
    statistics: str = "torch"  # which implementation formed the layer's statistics: "torch" or "fused"


class Positional:
    """Builds one layer's P block of rows by block of rows; its maps and profiles go through a QuantitySummary."""

    def __init__(self, q_sum: torch.Tensor, k_sum: torch.Tensor, *, layer: int, scale: float, samples: int,
                 seq_len: int, block: int, device: torch.device, causal: bool = True,
                 attended: Attended | None = None) -> None:  # fmt: skip
        heads = q_sum.shape[1]
        # float32 is enough: Q·K is about N² times a single q·k and is divided by N(N - 1), so its rounding
        # stays at float32's resolution of one score; the sums themselves were taken in float64
        self.q = (q_sum * (scale / (samples * (samples - 1)))).permute(1, 0, 2).float().contiguous()  # (H, T, hd)
        self.k = k_sum.permute(1, 0, 2).float().contiguous()
        self.scale, self.n, self.seq_len = float(scale), samples, seq_len
        self.part = QuantitySummary("positional", layer, heads=heads, seq_len=seq_len, block=block, causal=causal,
                                    mode="joint", device=device)  # fmt: skip
        self.attended = attended  # a model's own mask: P over its cells (docs/hdf5.md, 'Attended cells')
        if attended is not None:
            self.part.attend(attended)
        self.first = torch.zeros(heads, seq_len, FIRST_KEYS, dtype=torch.float64, device=device)  # P(i, j < 4)
        self._scratch = Scratch()  # a block of P and a temporary, kept while the layer's rows are formed

    def add(self, r0: int, scores_mean: torch.Tensor, bias_mean: torch.Tensor | None,
            scratch: Scratch | None = None) -> None:  # fmt: skip
        """Rows r0 .. r0 + rows - 1 from the block's per-cell mean scores (H, rows, r1) and mean bias (or None);
        ``scratch``: the caller's memory for the summary's temporaries (P itself is formed in memory of its own)."""
        rows, r1 = scores_mean.shape[-2:]
        # c·Q(i)·K(j) / (N(N - 1)) - (s̄ - b̄) / (N - 1) + b̄, with c·G = N (s̄ - b̄)
        p, diff = self._scratch.take(scores_mean.shape, 2, self.q.dtype, self.q.device)  # (H, rows, r1) each
        torch.matmul(self.q[:, r0 : r0 + rows], self.k[:, :r1].transpose(1, 2), out=p)
        if bias_mean is None:
            p.sub_(scores_mean, alpha=1.0 / (self.n - 1))
        else:
            p.sub_(torch.sub(scores_mean, bias_mean, out=diff), alpha=1.0 / (self.n - 1)).add_(bias_mean)
        keep = min(FIRST_KEYS, r1)
        early = p[..., :keep]
        if self.attended is not None:  # cells left out count for nothing
            early = early.masked_fill(~self.attended.rows(r0, r0 + rows, keep).to(p.device), 0.0)
        self.first[:, r0 : r0 + rows, :keep] = early
        self.part.add_moments(r0, p[None], owned=True, scratch=scratch)

    def result(self) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """(H, nb, nb) block means of P, its distance profile (2, H, T) over all cells and over keys j >= 4, and
        its diagnostics (H,) at full resolution (context dependence NaN: P is one matrix for all samples)."""
        summary = self.part.result(total_samples=self.n)
        mean_all = torch.as_tensor(summary.profile[0], dtype=torch.float64, device=self.first.device)  # (H, T) by d
        profile = from_key_profile(mean_all, self.first, self.attended)
        assert summary.diagnostics is not None
        return torch.as_tensor(summary.mean), profile, summary.diagnostics


def from_key_profile(mean_all: torch.Tensor, first: torch.Tensor, attended: Attended | None) -> torch.Tensor:
    """(2, H, T) float32 P by distance over all cells and over keys j >= 4, from its mean by distance ``mean_all``
    (H, T) and its cells at the first keys ``first`` (H, T, 4), P(i, j < 4) (0 where not attended)."""
    t = mean_all.shape[-1]
    d = torch.arange(t, device=first.device)
    count_all = (t - d).double()
    early = torch.zeros_like(mean_all)  # Σ over j < 4 of P(d + j, j)
    count_early = torch.zeros(t, dtype=torch.float64, device=first.device)
    for j in range(min(FIRST_KEYS, t)):
        i = d + j
        inside = i < t
        early[:, inside] += first[:, i[inside], j]
        count_early[inside] += 1
    if attended is not None:  # the attended cells of each distance, and of its first keys
        count_all = attended.per_distance.to(mean_all.device)
        count_early = attended.early_counts(FIRST_KEYS).to(mean_all.device)
        mean_all = torch.nan_to_num(mean_all)  # no attended cell at d: 0 cells, 0 sum
    rest = count_all - count_early
    from_key = (mean_all * count_all - early) / rest.clamp(min=1)
    from_key = torch.where(rest > 0, from_key, float("nan"))
    if attended is not None:
        mean_all = torch.where(count_all > 0, mean_all, float("nan"))
    return torch.stack([mean_all, from_key]).float()
