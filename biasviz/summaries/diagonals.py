"""Sums along the diagonals i - j = d: the distance profile and the Toeplitz residual, in O(H·T) memory.

Each cell is shifted by its diagonal's first cell (d, 0) before it is summed, so a diagonal whose cells are
all equal (every context-free bias that depends on i - j alone) has a spread and a residual of exactly 0.
Only cells with j <= i are summed, as in :mod:`biasviz.diagnostics.measures`.
"""

from __future__ import annotations

import torch

DEV, DEV_SQ, SPREAD_SQ = 0, 1, 2


class DiagonalSums:
    """Per head and distance: sums of (mean - ref_d), of its square, and of the per-cell variance over samples.

    Slot ``T - 1 - d`` holds distance ``d``, so query row i's keys j = 0 .. i fill the contiguous slots
    ``T - 1 - i .. T - 1`` in order: one slice add per row, no scatter.
    """

    def __init__(self, heads: int, seq_len: int, device: torch.device) -> None:
        self.seq_len = seq_len
        self.ref = torch.zeros(heads, seq_len, dtype=torch.float64, device=device)  # (H, T) reversed
        self.sums = torch.zeros(heads, 3, seq_len, dtype=torch.float64, device=device)  # (H, 3, T) reversed
        self.count = torch.zeros(seq_len, dtype=torch.float64, device=device)  # (T,) reversed

    def add(self, row0: int, mean: torch.Tensor, spread: torch.Tensor | None) -> None:
        """Rows ``row0 ..`` of the per-cell mean (H, rows, K) and standard deviation over samples (or None: 0).

        The block is copied skewed, row r shifted by ``rows - 1 - r``, so that each column holds one distance
        (column c: d = row0 + rows - 1 - c) and a sum over rows is a sum along the diagonals. The copy lands on
        each column's shift, so cells outside the block become exactly 0 once the shift is subtracted.
        """
        t = self.seq_len
        heads, rows, keys = mean.shape
        # the first cell (d, 0) of each diagonal that starts in these rows is its shift
        self.ref[:, t - row0 - rows : t - row0] = mean[:, :, 0].flip(-1).double()
        span = row0 + rows  # distances row0 + rows - 1 .. 0: slots t - span .. t - 1
        ref = self.ref[:, t - span :].to(mean.dtype)  # (H, span)
        dev = self._skewed(mean, ref[:, None, :].expand(heads, rows, span), span)  # (H, rows, span)
        dev -= ref[:, None, :]
        self.sums[:, DEV, t - span :] += dev.sum(1)  # a block's rows in float32, the running sums in float64
        self.sums[:, DEV_SQ, t - span :] += dev.square_().sum(1)
        if spread is not None:
            sq = self._skewed(spread, spread.new_zeros(heads, rows, span), span)
            self.sums[:, SPREAD_SQ, t - span :] += sq.square_().sum(1)
        c = torch.arange(span, device=mean.device)
        self.count[t - span :] += (c[None, :] >= (rows - 1 - torch.arange(rows, device=mean.device))[:, None]).sum(0)

    @staticmethod
    def _skewed(x: torch.Tensor, fill: torch.Tensor, span: int) -> torch.Tensor:
        """(H, rows, K) -> (H, rows, span), starting from a copy of ``fill``, row r's key j at column
        j + rows - 1 - r (columns past ``span`` - distances below 0 - are dropped)."""
        heads, rows, keys = x.shape
        width = max(span, keys + rows - 1)
        z = torch.empty(heads, rows, width, dtype=x.dtype, device=x.device)
        z[..., :span] = fill
        z.as_strided((heads, rows, keys), (rows * width, width - 1, 1), rows - 1).copy_(x)
        return z[..., :span]

    def profile(self) -> torch.Tensor:
        """(2, H, T) float32: mean and standard deviation over samples and cells, by distance d = 0 .. T-1."""
        n = self.count.flip(-1)  # (T,) distance order
        dev = self.sums[:, DEV].flip(-1) / n
        within = self.sums[:, SPREAD_SQ].flip(-1) / n  # mean over cells of the variance over samples
        between = torch.clamp(self.sums[:, DEV_SQ].flip(-1) / n - dev * dev, min=0.0)  # variance over cells
        mean = self.ref.flip(-1) + dev
        return torch.stack([mean, torch.sqrt(within + between)]).float()

    def toeplitz_rss(self) -> torch.Tensor:
        """(H,) sum over cells of (b̄ - its diagonal's mean)²: the Toeplitz residual's numerator, squared."""
        n = torch.clamp(self.count, min=1.0)
        per_d = self.sums[:, DEV_SQ] - self.sums[:, DEV] ** 2 / n
        return torch.clamp(per_d, min=0.0).sum(-1)
