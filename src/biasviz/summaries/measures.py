"""The diagnostics of docs/diagnostics.md from running sums, exact at full resolution whatever the map's.

Over the cells C = {(i, j): j <= i}, per head, with b̄ the mean bias over samples and σ its per-cell standard
deviation over samples:

- spread of b̄ over C: from sums of (b̄ - b̄(0, 0)) and its square (exactly 0 for a constant b̄);
- context dependence = mean over C of σ / spread;
- Toeplitz residual: from :class:`biasviz.summaries.diagonals.DiagonalSums`;
- separability residual: the least-squares s of b̄(i, j) ≈ s_i - s_j over the pairs j < i has the closed
  form s = g / T with g_t = Σ_{j<t} b̄(t, j) - Σ_{i>t} b̄(i, t) (a complete graph's Laplacian, as in
  :func:`biasviz.diagnostics.measures.separability_rms`), so its residual sum of squares is
  Σ_{j<i} b̄² - |g|² / T, plus Σ_i b̄(i, i)² for the diagonal cells that no s can change. A bidirectional model
  uses every pair i != j (each pair met both ways): g_t = Σ_{j!=t} b̄(t, j) - Σ_{i!=t} b̄(i, t), s = g / (2T),
  and the residual is Σ_{i!=j} b̄² - |g|² / (2T), plus the diagonal's.

Over C = every cell for a bidirectional model (docs/hdf5.md, 'Attended cells').
"""

from __future__ import annotations

import math

import numpy as np
import torch

from biasviz.store.format import DIAGNOSTIC_FIELDS
from biasviz.summaries.maps import zero_above_
from biasviz.summaries.scratch import Scratch


class BiasMeasureSums:
    """O(H·T) running sums over the cells j <= i of the mean bias, fed query rows in increasing order."""

    def __init__(self, heads: int, seq_len: int, device: torch.device) -> None:
        self.seq_len = seq_len
        f64 = {"dtype": torch.float64, "device": device}
        self.ref = torch.zeros(heads, **f64)  # b̄(0, 0): the shift of the spread's sums
        self.shifted = torch.zeros(heads, 2, **f64)  # sums of (b̄ - ref) and its square
        self.cells = 0
        self.spread_sum = torch.zeros(heads, **f64)  # sum over C of σ
        self.row_sum = torch.zeros(heads, seq_len, **f64)  # Σ_{j<i} b̄(i, j), by i
        self.col_sum = torch.zeros(heads, seq_len, **f64)  # Σ_{i>j} b̄(i, j), by j
        self.squares = torch.zeros(heads, 2, **f64)  # Σ_{j<i} b̄² (Σ_{j!=i} bidirectional), Σ_i b̄(i, i)²
        self.causal = True

    def add(self, row0: int, values: torch.Tensor, causal: bool = True, scratch: Scratch | None = None,
            mask: torch.Tensor | None = None) -> None:  # fmt: skip
        """Rows ``row0 ..``: the mean and, if ``values`` (S, H, rows, K) holds two, the spread, 0 in the cells j > i (a
        causal block has K = row0 + rows; otherwise every cell is used). In float64: the separability residual is a
        difference of two large sums; the shifted values are exactly 0 where the mean equals its first cell. The two
        float64 copies (in ``scratch``, if given) are squared in place: no further temporaries. ``mask`` (1 or H, rows,
        K): the cells a model's own mask attends to (docs/hdf5.md, 'Attended cells'), the others 0 in ``values``."""
        mean = values[0]
        rows, keys = mean.shape[-2:]
        self.causal = causal
        if row0 == 0:
            self.ref = mean[:, 0, 0].double()
        m, dev = (scratch or Scratch()).take(mean.shape, 2, torch.float64, mean.device)  # (H, rows, K) each
        m.copy_(mean)
        torch.sub(m, self.ref[:, None, None], out=dev)
        if mask is not None:  # the cells left out hold -ref: back to 0, and each head counts its own
            dev.masked_fill_(~mask, 0.0)
            self.cells = self.cells + mask.sum((1, 2), dtype=torch.float64).cpu().numpy()
        elif causal:  # the cells j > i, all in the trailing square, hold -ref: back to 0
            zero_above_(dev)
            self.cells += rows * (rows + 1) // 2 + rows * row0
        else:
            self.cells += rows * keys
        self.shifted[:, 0] += dev.sum((1, 2))
        self.shifted[:, 1] += dev.square_().sum((1, 2))
        if len(values) > 1:
            self.spread_sum += values[1].sum((1, 2), dtype=torch.float64)
        diag = torch.diagonal(m[:, :, row0 : row0 + rows], dim1=1, dim2=2)  # (H, rows): b̄(i, i)
        self.row_sum[:, row0 : row0 + rows] += m.sum(-1) - diag
        self.col_sum[:, :keys] += m.sum(1)
        self.col_sum[:, row0 : row0 + rows] -= diag
        diag_sq = (diag * diag).sum(-1)
        self.squares[:, 0] += m.square_().sum((1, 2)) - diag_sq  # last: diag is a view of m
        self.squares[:, 1] += diag_sq

    def results(self, samples: int, toeplitz_rss: torch.Tensor,
                laplacian: torch.Tensor | bool | None = None) -> np.ndarray:  # fmt: skip
        """(H,) records of ``DIAGNOSTIC_FIELDS`` (NaN where undefined), as ``biasviz diagnose`` defines them.

        ``laplacian`` (1 or H, T, T): a model's own mask's pairs (:meth:`Attended.laplacian`), where the closed
        forms of the triangle and the square do not hold; the least-squares s then solves L s = g. False: such a
        mask, too long to solve for: the separability residual is NaN.
        """
        n = np.maximum(np.broadcast_to(np.asarray(self.cells, dtype=np.float64), (len(self.ref),)), 1.0)
        s1, s2 = (self.shifted[:, k].cpu().numpy() for k in range(2))
        spread = np.sqrt(np.maximum(s2 / n - (s1 / n) ** 2, 0.0))
        g = (self.row_sum - self.col_sum).cpu().numpy()
        squares = self.squares[:, 0].cpu().numpy() + self.squares[:, 1].cpu().numpy()
        if laplacian is False:
            sep_rss = np.full(len(g), np.nan)
        elif isinstance(laplacian, torch.Tensor):
            sep_rss = squares - _fitted(laplacian, g)
        else:
            pairs = self.seq_len if self.causal else 2 * self.seq_len  # each pair met once (causal) or both ways
            sep_rss = squares - (g * g).sum(-1) / pairs
        toeplitz = toeplitz_rss.cpu().numpy()
        spread_sum = self.spread_sum.cpu().numpy()
        out = np.zeros(len(spread), dtype=[(name, np.float64) for name in DIAGNOSTIC_FIELDS])
        for h in range(len(spread)):
            dependence = _ratio(spread_sum[h] / n[h], spread[h]) if samples >= 2 else math.nan
            separability = math.nan if math.isnan(sep_rss[h]) else _ratio(math.sqrt(max(sep_rss[h], 0.0) / n[h]),
                                                                           spread[h])  # fmt: skip
            out[h] = (dependence, _ratio(math.sqrt(max(toeplitz[h], 0.0) / n[h]), spread[h]), separability)
        return out


def _fitted(laplacian: torch.Tensor, g: np.ndarray) -> np.ndarray:
    """(H,) s·g for the least-squares s of L s = g, per head (L (1 or H, T, T)): the part of Σ b̄² that s_i - s_j
    explains (the residual is Σ b̄² - s·g at the solution). g lies in L's range (each pair adds to one position
    what it takes from the other), so the minimum-norm solution of the pseudo-inverse is the least-squares one."""
    lap = laplacian.double().cpu()
    rhs = torch.as_tensor(g, dtype=torch.float64)  # (H, T)
    if lap.shape[0] == 1:  # one mask for every head: one factorisation
        s = torch.linalg.lstsq(lap[0], rhs.T, driver="gelsd").solution.T
    else:
        s = torch.linalg.lstsq(lap, rhs[..., None], driver="gelsd").solution[..., 0]
    return (s * rhs).sum(-1).numpy()


def _ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator; 0 when both are 0 (a constant bias), NaN when only the denominator is."""
    if denominator > 0:
        return float(numerator / denominator)
    return 0.0 if numerator == 0 else math.nan
