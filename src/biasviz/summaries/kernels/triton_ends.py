"""K3: the summary of a bias that differs by sample as b_a(i, j) = e_a(i) - e_a(j) (CABLE's, FoX's full gate), each
cell's mean and spread over samples formed tile by tile from T values a sample and head, never written.

Each cell's mean is b̄ = ē(i) - ē(j) (ē the mean of e over samples) and its spread over samples is that of
c_a(i) - c_a(j), c_a = e_a - ē taken in float64 and held in float32: the differences of small centred values, not of
the large cumulative sums, so a cell whose samples agree has a spread of about 0 rather than float32's rounding of e.
Their sums go to float64 accumulators, as the torch path's :class:`~biasviz.summaries.layer.QuantitySummary` of a bias
keeps them: block sums of the mean and spread, sums by distance of the mean less its diagonal's first cell b̄(d, 0), of
its square and of the variance, and the diagnostics' sums (:class:`~biasviz.summaries.measures.BiasMeasureSums`: row
and column sums below the diagonal, Σ b̄² below and on it, Σ b̄ and Σ b̄² over the cells, Σ σ). Causal cells j <= i.
Imported only where Triton is (:mod:`biasviz.summaries.kernels`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from biasviz.summaries.kernels.triton_tiles import add_diagonals, block_add, measure_sums


@triton.jit
def ends_statistics(ENDS, CENTRED, MAPS, DIST, ROWS, COLS, SQ, SHIFT, SPREAD, N: tl.constexpr, T: tl.constexpr, H,
                    BLOCK, NB, BM: tl.constexpr, SUB: tl.constexpr):  # fmt: skip
    """K3 for one query tile and head; grid (ceil(T / BM), H). ENDS (N + 1, H, T) fp32 (index N: ē), CENTRED (N, H, T)
    fp32 c_a; MAPS (2, H, NB, NB), DIST (3, H, T), ROWS (H, T), COLS (H, T), SQ (2, H), SHIFT (2, H), SPREAD (H,): fp64,
    added to. Square tiles of BM (``SUB`` as K2's)."""
    m0 = tl.program_id(0) * BM
    h = tl.program_id(1)
    rows = m0 + tl.arange(0, BM)
    mean_ends = ENDS + (N * H + h) * T
    e_i = tl.load(mean_ends + rows, mask=rows < T, other=0.0)
    e_0 = tl.load(mean_ends)
    for j0 in range(0, T, BM):  # the key tiles up to the query tile's last row
        if j0 < m0 + BM:
            cols = j0 + tl.arange(0, BM)
            dist = rows[:, None] - cols[None, :]
            used = (dist >= 0) & (rows[:, None] < T)
            e_j = tl.load(mean_ends + cols, mask=cols < T, other=0.0)
            mean = tl.where(used, e_i[:, None] - e_j[None, :], 0.0)
            s1 = tl.zeros([BM, BM], tl.float32)
            s2 = tl.zeros([BM, BM], tl.float32)
            for a in range(N):
                centred = CENTRED + (a * H + h) * T
                c_i = tl.load(centred + rows, mask=rows < T, other=0.0)
                c_j = tl.load(centred + cols, mask=cols < T, other=0.0)
                d = c_i[:, None] - c_j[None, :]
                s1 += d
                s2 += d * d
            m = s1 * (1.0 / N)
            var = tl.where(used, tl.maximum(s2 * (1.0 / N) - m * m, 0.0), 0.0)
            std = tl.sqrt(var)
            plane = NB * NB
            block_add(MAPS + h * plane, mean, m0, j0, rows, cols, used, BLOCK, NB, SUB, BM)
            block_add(MAPS + (H + h) * plane, std, m0, j0, rows, cols, used, BLOCK, NB, SUB, BM)
            # by distance, less each diagonal's first cell b̄(d, 0) = ē(d) - ē(0): a diagonal of equal cells adds 0
            first = tl.load(mean_ends + tl.maximum(dist, 0), mask=used, other=0.0) - e_0
            dev = tl.where(used, mean - first, 0.0)
            add_diagonals(DIST + h * T, dev, m0, j0, T, BM)
            add_diagonals(DIST + (H + h) * T, dev * dev, m0, j0, T, BM)
            add_diagonals(DIST + (2 * H + h) * T, var, m0, j0, T, BM)
            # the diagnostics' sums (b̄(0, 0) = 0: the spread's sums need no shift)
            measure_sums(ROWS, COLS, SQ, SHIFT, mean, 0.0, used, h, rows, cols, T, H)
            tl.atomic_add(SPREAD + h, tl.sum(tl.sum(std.to(tl.float64), 1), 0))
