"""The fused statistics kernels in Triton: a layer's scores and weights formed tile by tile in registers from q, k and
a bias of distance, never written, and reduced where they are formed.

Notation: sample a of N, head h of H (key head h // group), query i, key j <= i (causal), d = i - j,
s_a(i, j) = c q_a(i)·k_a(j) + f_h(d), w_a(i, j) = exp(s_a(i, j) - lse_a(i)).

- :func:`row_lse` (K1): each sample's row log-sum-exp, an online softmax over key tiles with no P·V.
- :func:`tile_statistics` (K2): one program per query tile and head walks the key tiles up to the diagonal; for each
  tile every sample's s and w are formed in turn, and their per-cell moments over samples (shifted by the first
  sample's value, as :class:`~biasviz.summaries.moments.ShiftedSums` does) give each cell's mean and spread. Those go
  to float64 accumulators: block maps (sums of the cells' mean and spread per map block), sums by distance (mean,
  mean², spread²), column sums of the weights' mean; and per sample, each row's Σ_j w·s (the entropy is
  lse - Σ w·s) and the weight on key 0 (the sink).

fp32 inside a tile; fp64 only in the accumulators. The length and the number of samples bound loops, so they are
compile-time constants (one compilation per length and N in a run): Triton's interpreter of the 3.6 series takes a
loop's bounds only so. The kernels run on a GPU, or on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``) where the tests prove them. Imported only where Triton is (:mod:`biasviz.summaries.kernels`).
"""

from __future__ import annotations

import triton
import triton.language as tl

# accumulator rows of the block maps and of the sums by distance
MAP_STATS = ("weights_mean", "weights_std", "scores_mean", "scores_std")  # (4, H, nb, nb): Σ over a block's cells
DISTANCE_STATS = ("weights_mean", "weights_mean_sq", "weights_var", "scores_mean", "scores_mean_sq", "scores_var")


@triton.jit
def _scores(Q, K, TABLE, a, h, kh, rows, cols, dims, sqn, sqh, sqt, sqd, skn, skh, skt, skd, T, HD, scale,
            HAS_BIAS: tl.constexpr):  # fmt: skip
    """(BM, BN) fp32 scores of sample ``a``, head ``h``: c q k^T + f_h(i - j) (0 past the diagonal: masked later)."""
    dim_ok = dims[None, :] < HD
    q = tl.load(Q + a * sqn + h * sqh + rows[:, None] * sqt + dims[None, :] * sqd,
                mask=(rows[:, None] < T) & dim_ok, other=0.0).to(tl.float32)  # fmt: skip
    k = tl.load(K + a * skn + kh * skh + cols[:, None] * skt + dims[None, :] * skd,
                mask=(cols[:, None] < T) & dim_ok, other=0.0).to(tl.float32)  # fmt: skip
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    if HAS_BIAS:
        dist = rows[:, None] - cols[None, :]
        s += tl.load(TABLE + h * T + dist, mask=(dist >= 0) & (rows[:, None] < T), other=0.0)
    return s


@triton.jit
def _sample_tile(Q, K, TABLE, LSE, ROW_WS, SINKS, a, h, kh, j0, rows, cols, dims, used, sqn, sqh, sqt, sqd, skn,
                 skh, skt, skd, T, H, HD, scale, HAS_BIAS: tl.constexpr):  # fmt: skip
    """Sample ``a``'s scores and weights of one tile, 0 in the cells not ``used``; its rows' Σ w·s added to ROW_WS,
    and in the first key tile its weight on key 0 to SINKS (the rows are this program's: no race on ROW_WS)."""
    s = _scores(Q, K, TABLE, a, h, kh, rows, cols, dims, sqn, sqh, sqt, sqd, skn, skh, skt, skd, T, HD, scale,
                HAS_BIAS)  # fmt: skip
    at = (a * H + h) * T
    lse = tl.load(LSE + at + rows, mask=rows < T, other=0.0)
    w = tl.where(used, tl.exp(s - lse[:, None]), 0.0)
    s = tl.where(used, s, 0.0)
    tl.store(ROW_WS + at + rows, tl.load(ROW_WS + at + rows, mask=rows < T, other=0.0)
             + tl.sum(w * s, 1).to(tl.float64), mask=rows < T)  # fmt: skip
    if j0 == 0:
        tl.atomic_add(SINKS + a * H + h, tl.sum(tl.where(cols[None, :] == 0, w, 0.0)).to(tl.float64))
    return s, w


@triton.jit
def row_lse(Q, K, TABLE, LSE, sqn, sqh, sqt, sqd, skn, skh, skt, skd, T: tl.constexpr, H, GROUP, HD, scale,
            DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr):  # fmt: skip
    """K1: LSE (N, H, T) fp32 of every sample's causal rows; grid (ceil(T / BM), N * H)."""
    m0 = tl.program_id(0) * BM
    nh = tl.program_id(1)
    a, h = nh // H, nh % H
    rows = m0 + tl.arange(0, BM)
    dims = tl.arange(0, DP)
    best = tl.full([BM], float("-inf"), tl.float32)
    total = tl.zeros([BM], tl.float32)
    for j0 in range(0, T, BN):  # the key tiles up to the query tile's last row; those after it skipped
        if j0 < m0 + BM:
            cols = j0 + tl.arange(0, BN)
            s = _scores(Q, K, TABLE, a, h, h // GROUP, rows, cols, dims, sqn, sqh, sqt, sqd, skn, skh, skt, skd, T, HD,
                        scale, HAS_BIAS)  # fmt: skip
            s = tl.where((cols[None, :] <= rows[:, None]) & (rows[:, None] < T), s, float("-inf"))
            top = tl.maximum(best, tl.max(s, 1))
            top = tl.where(top == float("-inf"), 0.0, top)  # a row past T: nothing, and no NaN from -inf - -inf
            total = total * tl.exp(best - top) + tl.sum(tl.exp(s - top[:, None]), 1)
            best = top
    tl.store(LSE + nh * T + rows, best + tl.log(tl.where(rows < T, total, 1.0)), mask=rows < T)


@triton.jit
def tile_statistics(Q, K, TABLE, LSE, MAPS, DIST, COLS, ROW_WS, SINKS,
                    sqn, sqh, sqt, sqd, skn, skh, skt, skd, N: tl.constexpr, T: tl.constexpr, H, GROUP, HD, scale,
                    BLOCK, NB,
                    DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr,
                    WHOLE: tl.constexpr):  # fmt: skip
    """K2: every accumulator of the module docstring, for one query tile and head; grid (ceil(T / BM), H).

    MAPS (4, H, NB, NB), DIST (6, H, T), COLS (2, H, T), ROW_WS (N, H, T), SINKS (N, H): fp64, added to. ``WHOLE``:
    the map's blocks are whole tiles (BLOCK a multiple of BM = BN), so a tile adds four sums, not four per cell."""
    m0 = tl.program_id(0) * BM
    h = tl.program_id(1)
    kh = h // GROUP
    rows = m0 + tl.arange(0, BM)
    dims = tl.arange(0, DP)
    inv_n = 1.0 / N
    for j0 in range(0, T, BN):  # the key tiles up to the query tile's last row; those after it skipped
        if j0 < m0 + BM:
            cols = j0 + tl.arange(0, BN)
            used = (cols[None, :] <= rows[:, None]) & (rows[:, None] < T)
            s0, w0 = _sample_tile(Q, K, TABLE, LSE, ROW_WS, SINKS, 0, h, kh, j0, rows, cols, dims, used, sqn, sqh,
                                  sqt, sqd, skn, skh, skt, skd, T, H, HD, scale, HAS_BIAS)  # the moments' shift
            dw1 = tl.zeros([BM, BN], tl.float32)
            dw2 = tl.zeros([BM, BN], tl.float32)
            ds1 = tl.zeros([BM, BN], tl.float32)
            ds2 = tl.zeros([BM, BN], tl.float32)
            for a in range(1, N):
                s, w = _sample_tile(Q, K, TABLE, LSE, ROW_WS, SINKS, a, h, kh, j0, rows, cols, dims, used, sqn, sqh,
                                    sqt, sqd, skn, skh, skt, skd, T, H, HD, scale, HAS_BIAS)  # fmt: skip
                d = w - w0
                dw1 += d
                dw2 += d * d
                d = s - s0
                ds1 += d
                ds2 += d * d
            # each cell's mean and population spread over the samples (0 past the diagonal: every sum is 0 there)
            mw = dw1 * inv_n
            var_w = tl.maximum(dw2 * inv_n - mw * mw, 0.0)
            mean_w = w0 + mw
            ms = ds1 * inv_n
            var_s = tl.maximum(ds2 * inv_n - ms * ms, 0.0)
            mean_s = s0 + ms
            # block maps: a tile inside one block adds its sums (every cell past the diagonal holds 0), else each cell
            plane = NB * NB
            base = MAPS + h * plane
            stride = H * plane
            if WHOLE:
                cell = (m0 // BLOCK) * NB + j0 // BLOCK
                tl.atomic_add(base + cell, tl.sum(tl.sum(mean_w, 1), 0).to(tl.float64))
                tl.atomic_add(base + stride + cell, tl.sum(tl.sum(tl.sqrt(var_w), 1), 0).to(tl.float64))
                tl.atomic_add(base + 2 * stride + cell, tl.sum(tl.sum(mean_s, 1), 0).to(tl.float64))
                tl.atomic_add(base + 3 * stride + cell, tl.sum(tl.sum(tl.sqrt(var_s), 1), 0).to(tl.float64))
            else:
                cell = (rows[:, None] // BLOCK) * NB + cols[None, :] // BLOCK
                tl.atomic_add(base + cell, mean_w.to(tl.float64), mask=used)
                tl.atomic_add(base + stride + cell, tl.sqrt(var_w).to(tl.float64), mask=used)
                tl.atomic_add(base + 2 * stride + cell, mean_s.to(tl.float64), mask=used)
                tl.atomic_add(base + 3 * stride + cell, tl.sqrt(var_s).to(tl.float64), mask=used)
            # sums by distance d = i - j
            by_d = DIST + h * T + rows[:, None] - cols[None, :]
            line = H * T
            tl.atomic_add(by_d, mean_w.to(tl.float64), mask=used)
            tl.atomic_add(by_d + line, (mean_w * mean_w).to(tl.float64), mask=used)
            tl.atomic_add(by_d + 2 * line, var_w.to(tl.float64), mask=used)
            tl.atomic_add(by_d + 3 * line, mean_s.to(tl.float64), mask=used)
            tl.atomic_add(by_d + 4 * line, (mean_s * mean_s).to(tl.float64), mask=used)
            tl.atomic_add(by_d + 5 * line, var_s.to(tl.float64), mask=used)
            # the weights' column sums (each key's share over the queries): Σ_i w̄ and Σ_i (σ² + w̄²)
            tl.atomic_add(COLS + h * T + cols, tl.sum(mean_w, 0).to(tl.float64), mask=cols < T)
            tl.atomic_add(COLS + (H + h) * T + cols, tl.sum(var_w + mean_w * mean_w, 0).to(tl.float64), mask=cols < T)
