"""What the fused statistics kernels (:mod:`biasviz.summaries.kernels.triton_kernels`) do within one tile: q's and
k's rows loaded, the bias and the scores of a tile formed, a softcap applied, the attended cells read from a mask's
bits, and a tile's sums added to the block maps and the sums by distance. Triton functions, inlined where the kernels
call them (notation as in :mod:`~biasviz.summaries.kernels.triton_kernels`)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_rows(X, a, h, rows, dims, sxn, sxh, sxt, sxd, T, HD):
    """(len(rows), DP) fp32 of ``X[a, h, rows, :]`` (0 past T and past the head dim)."""
    return tl.load(X + a * sxn + h * sxh + rows[:, None] * sxt + dims[None, :] * sxd,
                   mask=(rows[:, None] < T) & (dims[None, :] < HD), other=0.0).to(tl.float32)  # fmt: skip


@triton.jit
def tile_bias(TABLE, a, h, rows, cols, T, H, KIND: tl.constexpr, HID: tl.constexpr):
    """(BM, BN) fp32 b_h(i, j): f_h(i - j) (``KIND`` 1), g_h(j) (2), (3) FIRE's MLP of ψ(i - j) / ψ(max(L, i)),
    formed here cell by cell from TABLE = [ψ(d) (T), ψ(max(L, i)) (T), W1 (HID), b1 (HID), W2 (H, HID), b2 (H)]:
    b_h = b2_h + Σ_k W2_hk·max(W1_k u + b1_k, 0), the hidden units in turn; or read cell by cell from TABLE (T, T),
    one for every head (4), or (H, T, T) (5); or (6) sample ``a``'s e_a,h(i) - e_a,h(j) from TABLE (N + 1, H, T)
    (index N: the mean over samples, ē), or (7) its row of keys g_a,h(j) from the same; 0 past the diagonal."""
    dist = rows[:, None] - cols[None, :]
    inside = (dist >= 0) & (rows[:, None] < T)
    if KIND >= 6:  # each sample's own (index N: the mean over samples)
        own = TABLE + (a * H + h) * T
        e_j = tl.load(own + cols, mask=cols < T, other=0.0)
        if KIND == 7:  # g_a(j)
            return tl.where(inside, e_j[None, :] + 0.0 * rows[:, None], 0.0)
        e_i = tl.load(own + rows, mask=rows < T, other=0.0)
        return tl.where(inside, e_i[:, None] - e_j[None, :], 0.0)
    if KIND >= 4:  # offsets in int64: H T² passes 2^31 from T = 8192 on
        at = ((h * (KIND - 4)).to(tl.int64) * T + rows[:, None].to(tl.int64)) * T + cols[None, :]
        return tl.load(TABLE + at, mask=inside, other=0.0)
    if KIND == 3:
        u = tl.load(TABLE + tl.maximum(dist, 0), mask=inside, other=0.0) / tl.load(TABLE + T + rows, mask=rows < T,
                                                                                     other=1.0)[:, None]  # fmt: skip
        weights = TABLE + 2 * T
        out = u * 0.0 + tl.load(weights + 2 * HID + H * HID + h)
        for k in tl.static_range(HID):
            hidden = tl.maximum(u * tl.load(weights + k) + tl.load(weights + HID + k), 0.0)
            out += hidden * tl.load(weights + 2 * HID + h * HID + k)
        return tl.where(inside, out, 0.0)
    at = dist
    if KIND == 2:
        at = cols[None, :] + 0 * rows[:, None]
    return tl.load(TABLE + h * T + at, mask=inside, other=0.0)


@triton.jit
def capped(s, cap, SOFTCAP: tl.constexpr):
    """z = cap·tanh(s / cap) (``SOFTCAP``), else s. tanh as (1 - e^-2|x|) / (1 + e^-2|x|), and below |x| = 1/8, where
    1 - e^-2|x| would lose digits, as its series to x^7 (the next term under 2e-10 of x): float32's rounding either
    way."""
    if SOFTCAP:
        x = s / cap
        ax = tl.abs(x)
        e = tl.exp(-2.0 * ax)
        x2 = x * x
        series = ax * (1.0 + x2 * (-1.0 / 3.0 + x2 * (2.0 / 15.0 - x2 * (17.0 / 315.0))))
        t = tl.where(ax < 0.125, series, (1.0 - e) / (1.0 + e))
        return cap * tl.where(x < 0, -t, t)
    return s


@triton.jit
def tile_scores(Q, K, TABLE, a, h, kh, rows, cols, dims, sqn, sqh, sqt, sqd, skn, skh, skt, skd, T, H, HD, scale,
                HAS_BIAS: tl.constexpr, HID: tl.constexpr):  # fmt: skip
    """(BM, BN) fp32 scores of sample ``a``, head ``h``: c q k^T + b_h(i, j) (0 past the diagonal: masked later)."""
    q = load_rows(Q, a, h, rows, dims, sqn, sqh, sqt, sqd, T, HD)
    k = load_rows(K, a, kh, cols, dims, skn, skh, skt, skd, T, HD)
    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    if HAS_BIAS:
        s += tile_bias(TABLE, a, h, rows, cols, T, H, HAS_BIAS, HID)
    return s


@triton.jit
def attended_cells(CELLS, cls, rows, cols, T, W, MASKED: tl.constexpr):
    """(BM, BN) bool: the tile's cells attended, j <= i, or (``MASKED``) the mask's bits where the tile's class
    ``cls`` is 2 (a class-1 tile reads none: every cell inside T is attended)."""
    if MASKED:
        inside = (rows[:, None] < T) & (cols[None, :] < T)
        byte = tl.load(CELLS + rows[:, None] * W + cols[None, :] // 8, mask=inside & (cls == 2), other=0)
        return inside & ((cls == 1) | (((byte.to(tl.int32) >> (cols[None, :] % 8)) & 1) != 0))
    return (cols[None, :] <= rows[:, None]) & (rows[:, None] < T)


@triton.jit
def tile_class(CLASSES, m0, j0, NKT, BM: tl.constexpr, BN: tl.constexpr, MASKED: tl.constexpr):
    """The class of the tile at (m0, j0): CLASSES' with ``MASKED``, else 2 (the causal rule decides each cell)."""
    if MASKED:
        return tl.load(CLASSES + (m0 // BM) * NKT + j0 // BN).to(tl.int32)
    return tl.full([], 2, tl.int32)


@triton.jit
def sample_cells(CELLS, CLASSES, a, m0, j0, rows, cols, T, W, NKT, BM: tl.constexpr, BN: tl.constexpr,
                  MASKED: tl.constexpr, BY_SAMPLE: tl.constexpr):  # fmt: skip
    """(BM, BN) bool: sample ``a``'s attended cells of the tile at (m0, j0) (``BY_SAMPLE``: its own bits and class)."""
    if BY_SAMPLE:
        cls = tile_class(CLASSES + a * NKT * NKT, m0, j0, NKT, BM, BN, MASKED)
        return attended_cells(CELLS + a * T * W, cls, rows, cols, T, W, MASKED) & (cls != 0)
    return attended_cells(CELLS, tile_class(CLASSES, m0, j0, NKT, BM, BN, MASKED), rows, cols, T, W, MASKED)


@triton.jit
def block_add(PTR, x, m0, j0, rows, cols, used, BLOCK, NB, SUB: tl.constexpr, TILE: tl.constexpr):
    """Add a square tile ``x`` (0 in the cells not ``used``) to the (NB, NB) block map at PTR. ``SUB`` = TILE: the
    tile lies inside one block, its sum is one atomic; 0 < SUB < TILE: blocks of SUB positions split the tile, each
    block's sum is one atomic ((TILE / SUB)² of them, those with a cell j <= i); 0: each cell to its block."""
    if SUB == TILE:
        tl.atomic_add(PTR + (m0 // BLOCK) * NB + j0 // BLOCK, tl.sum(tl.sum(x, 1), 0).to(tl.float64))
    elif SUB > 0:
        parts = tl.sum(tl.sum(tl.reshape(x, (TILE // SUB, SUB, TILE // SUB, SUB)), 3), 1)  # (TILE / SUB) ** 2
        at = tl.arange(0, TILE // SUB)
        r, c = m0 // SUB + at, j0 // SUB + at
        tl.atomic_add(PTR + r[:, None] * NB + c[None, :], parts.to(tl.float64),
                      mask=(c[None, :] <= r[:, None]) & (r[:, None] < NB))  # fmt: skip
    else:
        tl.atomic_add(PTR + (rows[:, None] // BLOCK) * NB + cols[None, :] // BLOCK, x.to(tl.float64), mask=used)


@triton.jit
def add_diagonals(PTR, x, m0, j0, T, TILE: tl.constexpr):
    """Add a square tile ``x`` (0 in the cells not used) to the sums by distance at PTR, PTR[d] += Σ of its cells
    with i - j = d: each diagonal summed in the tile first (a gather along the rows), then one atomic a diagonal, 2
    TILE - 1 a tile instead of one a cell (the cells of one diagonal would otherwise meet at one address, one after
    another)."""
    r = tl.arange(0, TILE)
    o = tl.arange(0, 2 * TILE)  # the tile's diagonal o holds row r's column r - o + TILE - 1
    column = r[:, None] - o[None, :] + (TILE - 1)
    inside = (column >= 0) & (column < TILE)
    along = tl.gather(x, tl.where(inside, column, 0), 1)  # (TILE, 2 TILE): row r's cell on each diagonal
    sums = tl.sum(tl.where(inside, along, 0.0), 0)
    d = m0 - j0 + o - (TILE - 1)
    tl.atomic_add(PTR + d, sums.to(tl.float64), mask=(d >= 0) & (d < T) & (o < 2 * TILE - 1))


@triton.jit
def measure_sums(ROWS, COLS, SQ, SHIFT, x, ref, used, h, rows, cols, T, H):
    """The diagnostics' sums of one tile of a matrix ``x`` (0 in the cells not ``used``), as the torch path's
    :class:`~biasviz.summaries.measures.BiasMeasureSums` takes them, in fp64 from the tile's fp32 cells (they are
    differences of large sums, Σ x² - |g|² / T): by row and by column below the diagonal (ROWS, COLS (H, T)), Σ x²
    below and on it (SQ (2, H)), and Σ of x - ``ref`` over the cells used and of its square (SHIFT (2, H))."""
    x64 = x.to(tl.float64)
    lower = tl.where(cols[None, :] < rows[:, None], x64, 0.0)
    tl.atomic_add(ROWS + h * T + rows, tl.sum(lower, 1), mask=rows < T)
    tl.atomic_add(COLS + h * T + cols, tl.sum(lower, 0), mask=cols < T)
    tl.atomic_add(SQ + h, tl.sum(tl.sum(lower * lower, 1), 0))
    diag = tl.where(cols[None, :] == rows[:, None], x64, 0.0)
    tl.atomic_add(SQ + H + h, tl.sum(tl.sum(diag * diag, 1), 0))
    shifted = tl.where(used, x64 - ref, 0.0)
    tl.atomic_add(SHIFT + h, tl.sum(tl.sum(shifted, 1), 0))
    tl.atomic_add(SHIFT + H + h, tl.sum(tl.sum(shifted * shifted, 1), 0))
