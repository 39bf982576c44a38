"""The fused statistics kernels in Triton: a layer's scores and weights formed tile by tile in registers from q, k and
a bias of distance, never written, and reduced where they are formed.

Notation: sample a of N, head h of H (key head h // group), query i, key j <= i (causal), d = i - j,
s_a(i, j) = c q_a(i)·k_a(j) + b_h(i, j), w_a(i, j) = exp(s_a(i, j) - lse_a(i)). The bias b is none (``HAS_BIAS`` 0), a
table of distance f_h(d) (1: a scheme's, ALiBi or T5 kept from a call) or a row of keys g_h(j) (2: BLOOM's m_h·j), its
table TABLE (H, T) either way, (3) FIRE's MLP of the interpolated distance, formed cell by cell from its weights, or
a bias read cell by cell, (T, T) for every head (4) or (H, T, T) (5), or each sample's own, e_a(i) - e_a(j) (6: CABLE's,
FoX's; the scores' moments then over s itself, and P's b the mean over samples, ē(i) - ē(j)) or g_a(j) (7: BLOOM's
beside padding, where samples attend cells of their own and no P is formed)
(:func:`~biasviz.summaries.kernels.triton_tiles.tile_bias`). The weights are w_a(i, j) = exp(z_a(i, j) - lse_a(i)):
z = s, or (``SOFTCAP``) Gemma 2's z = cap·tanh(s / cap); lse runs over the attended keys and (``HAS_SINKS``)
GPT-OSS's sink columns beside them, each row's sink logit read from SINK_LOGITS (N, T, H) (the keys' weights then sum
to less than 1). The scores are s either way, before the cap, as the call takes them in.

- :func:`row_lse` (K1): each sample's row log-sum-exp, an online softmax over key tiles with no P·V.
- :func:`tile_statistics` (K2): one program per query tile and head walks the key tiles up to the diagonal; for each
  tile every sample's s and w are formed in turn, and their per-cell moments over samples (shifted by the first
  sample's value, as :class:`~biasviz.summaries.moments.ShiftedSums` does) give each cell's mean and spread. Those go
  to float64 accumulators: block maps (sums of the cells' mean and spread per map block), sums by distance (mean,
  mean², spread²), column sums of the weights' mean; and per sample, each row's Σ_j w·(z - lse) = Σ_j w log w
  (the entropy's negative), the weight on key 0 (the sink), column sums of w, sums by distance and block sums of w
  and s, and the weight on each tenth of a row's context. With N >= 2 the positional logits
  P = c Q·K / (N(N - 1)) - (s̄ - f) / (N - 1) + f (Q = Σ_a q_a, K = Σ_a k_a, formed on the host) in the same tile:
  their block sums, sums by distance, first keys, row and column sums, sums of squares. (The jackknife's block sums
  need no cells: the host forms them from the per-sample block sums of s, see :mod:`biasviz.summaries.kernels`.)
  ``tests/summaries/fused_reference.py`` defines every accumulator in float64 numpy.

With ``MASKED`` the cells attended are one mask's for every sample, within the causal triangle, every row seeing a key
(a sliding window, a call's own bool mask): its bits packed eight a byte (CELLS (T, ceil(T / 8)) uint8) and a class
per (query tile, key tile) as FlexAttention's block mask has (CLASSES int8: 0 no cell attended, the tile skipped; 1
every cell inside T, no bit read; 2 some, the bits read); a row's tenths of its context are those of its attended keys
by rank (BOUNDS (T, 11) int32: the first key of each tenth, T for rows of fewer than 10 keys). With ``BY_SAMPLE``
each sample attends cells of its own (padding, documents that differ by sample): CELLS (N, T, ceil(T / 8)), CLASSES
(N + 1, tiles, tiles) (index N: some sample's cells in the tile, which K2 walks), BOUNDS (N, T, 11), each sample's
read for it; a row with no key has lse 0 (its weights 0, its entropy 0); each cell's moments are over the samples that
attend it (shifted by the first of those; 0 where none does) and the key columns sum each sample's w and w² / N.

fp32 inside a tile; fp64 only in the accumulators. The length and the number of samples bound loops, so they are
compile-time constants (one compilation per length and N in a run): Triton's interpreter of the 3.6 series takes a
loop's bounds only so. The kernels run on a GPU, or on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``) where the tests prove them. Imported only where Triton is (:mod:`biasviz.summaries.kernels`).
"""

from __future__ import annotations

import triton
import triton.language as tl

from biasviz.store.datasets import map_name
from biasviz.summaries.kernels.triton_tiles import (
    add_diagonals,
    attended_cells,
    block_add,
    capped,
    load_rows,
    measure_sums,
    sample_cells,
    tile_bias,
    tile_class,
    tile_scores,
)

# accumulator rows of the block maps, (4, H, nb, nb): Σ over a block's cells, and of the sums by distance (per
# quantity its total, its squares and its spread: labels of the rows, not datasets)
MAP_STATS = tuple(map_name(kind, stat) for kind in ("weights", "scores") for stat in ("mean", "std"))
SEGMENTS = tl.constexpr(10)  # the context's tenths
DISTANCE_STATS = tuple(f"{kind}_{stat}" for kind in ("weights", "scores") for stat in ("mean", "mean_sq", "var"))


@triton.jit
def _sample_tile(Q, K, TABLE, LSE, ROW_WS, SINKS, SCOLS, CTX, SDIST, SBLOCKS, BOUNDS, COLS, a, h, kh, m0, j0, rows,
                 cols, dims, used, lo, hi, sqn, sqh, sqt, sqd, skn, skh, skt, skd, N: tl.constexpr, T, H, HD, scale,
                 cap, BLOCK, NB, HAS_BIAS: tl.constexpr, SUB: tl.constexpr, TILE: tl.constexpr, MASKED: tl.constexpr,
                 BY_SAMPLE: tl.constexpr, SOFTCAP: tl.constexpr, HID: tl.constexpr):  # fmt: skip
    """Sample ``a``'s logits c q k^T and weights of one tile, 0 in the cells not ``used``, and its own sums: each
    row's Σ w·(z - lse) (ROW_WS: the rows are this program's, no race), the weight on key 0 (SINKS, first key tile),
    column sums of w (SCOLS), sums by distance of w and s (SDIST), block sums of w and s (SBLOCKS), and the sums of w
    over each tenth of the context (CTX; ``lo`` .. ``hi`` bound the tenths in the tile). Few tiles stay live across the
    samples (the bias is loaded again, each tenth's cells found by products, not divisions): a 64 x 64 tile too."""
    q = load_rows(Q, a, h, rows, dims, sqn, sqh, sqt, sqd, T, HD)
    k = load_rows(K, a, kh, cols, dims, skn, skh, skt, skd, T, HD)
    raw = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    s = (raw + tile_bias(TABLE, a, h, rows, cols, T, H, HAS_BIAS, HID)) if HAS_BIAS else raw  # as K1 forms it
    if HAS_BIAS >= 6:  # a bias of each sample's own: the scores' moments over s itself
        raw = s
    at = a * H + h
    lse = tl.load(LSE + at * T + rows, mask=rows < T, other=0.0)
    log_w = capped(s, cap, SOFTCAP) - lse[:, None]
    w = tl.where(used, tl.exp(log_w), 0.0)
    s = tl.where(used, s, 0.0)
    tl.store(ROW_WS + at * T + rows, tl.load(ROW_WS + at * T + rows, mask=rows < T, other=0.0)
             + tl.sum(tl.where(used, w * log_w, 0.0), 1).to(tl.float64), mask=rows < T)  # fmt: skip
    if j0 == 0:
        tl.atomic_add(SINKS + at, tl.sum(tl.where(cols[None, :] == 0, w, 0.0)).to(tl.float64))
    tl.atomic_add(SCOLS + at * T + cols, tl.sum(w, 0).to(tl.float64), mask=cols < T)
    if BY_SAMPLE:  # the key profile over each sample's own weights: Σ_a Σ_i w_a / N and Σ_a Σ_i w_a² / N
        w64 = w.to(tl.float64)  # squared and summed in fp64: see the columns of the joint moments below
        tl.atomic_add(COLS + h * T + cols, tl.sum(w64, 0) * (1.0 / N), mask=cols < T)
        tl.atomic_add(COLS + (H + h) * T + cols, tl.sum(w64 * w64, 0) * (1.0 / N), mask=cols < T)
    add_diagonals(SDIST + at * T, w, m0, j0, T, TILE)
    add_diagonals(SDIST + (N * H + at) * T, s, m0, j0, T, TILE)
    plane = NB * NB
    block_add(SBLOCKS + at * plane, w, m0, j0, rows, cols, used, BLOCK, NB, SUB, TILE)
    block_add(SBLOCKS + (N * H + at) * plane, s, m0, j0, rows, cols, used, BLOCK, NB, SUB, TILE)
    ten_j = SEGMENTS * cols[None, :]  # j in tenth t of row i's context: t (i + 1) <= 10 j < (t + 1)(i + 1)
    ctx = used & (rows[:, None] + 1 >= SEGMENTS)
    for seg in tl.static_range(SEGMENTS):  # a tile's cells span few tenths: a sum for each of those
        if MASKED:  # the tenths by rank among the row's attended keys: BOUNDS' first key of each
            at_row = BOUNDS + (a * T * BY_SAMPLE + rows) * (SEGMENTS + 1) + seg
            start = tl.load(at_row, mask=rows < T, other=T)
            stop = tl.load(at_row + 1, mask=rows < T, other=T)
            cells = used & (cols[None, :] >= start[:, None]) & (cols[None, :] < stop[:, None])
            tl.atomic_add(CTX + at * SEGMENTS + seg, tl.sum(tl.sum(tl.where(cells, w, 0.0), 1), 0).to(tl.float64))
        elif (seg >= lo) & (seg <= hi):
            cells = ctx & (ten_j >= seg * (rows[:, None] + 1)) & (ten_j < (seg + 1) * (rows[:, None] + 1))
            tl.atomic_add(CTX + at * SEGMENTS + seg, tl.sum(tl.sum(tl.where(cells, w, 0.0), 1), 0).to(tl.float64))
    return tl.where(used, raw, 0.0), w


@triton.jit
def row_lse(Q, K, TABLE, LSE, CELLS, CLASSES, SINK_LOGITS, sqn, sqh, sqt, sqd, skn, skh, skt, skd, ssn, sst, ssh,
            T: tl.constexpr, H, GROUP, HD, scale, cap, W, NKT, DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
            HAS_BIAS: tl.constexpr, MASKED: tl.constexpr, BY_SAMPLE: tl.constexpr = False,
            SOFTCAP: tl.constexpr = False, HAS_SINKS: tl.constexpr = False, HID: tl.constexpr = 1):  # fmt: skip
    """K1: LSE (N, H, T) fp32 of every sample's causal (or ``MASKED``) rows of z, beside each row's sink logit
    (``HAS_SINKS``: SINK_LOGITS[a, i, h], strides ``ssn``, ``sst``, ``ssh``); grid (ceil(T / BM), N * H)."""
    m0 = tl.program_id(0) * BM
    nh = tl.program_id(1)
    a, h = nh // H, nh % H
    rows = m0 + tl.arange(0, BM)
    dims = tl.arange(0, DP)
    best = tl.full([BM], float("-inf"), tl.float32)
    total = tl.zeros([BM], tl.float32)
    classes = CLASSES + a * NKT * NKT * BY_SAMPLE  # this sample's (BY_SAMPLE) or the one mask's
    for j0 in range(0, T, BN):  # the key tiles up to the query tile's last row; those after it skipped
        cls = tile_class(classes, m0, j0, NKT, BM, BN, MASKED)
        if (j0 < m0 + BM) & (cls != 0):
            cols = j0 + tl.arange(0, BN)
            s = tile_scores(Q, K, TABLE, a, h, h // GROUP, rows, cols, dims, sqn, sqh, sqt, sqd, skn, skh, skt, skd, T,
                            H, HD, scale, HAS_BIAS, HID)  # fmt: skip
            s = capped(s, cap, SOFTCAP)
            s = tl.where(attended_cells(CELLS + a * T * W * BY_SAMPLE, cls, rows, cols, T, W, MASKED), s, float("-inf"))
            top = tl.maximum(best, tl.max(s, 1))
            top = tl.where(top == float("-inf"), 0.0, top)  # a row past T: nothing, and no NaN from -inf - -inf
            total = total * tl.exp(best - top) + tl.sum(tl.exp(s - top[:, None]), 1)
            best = top
    if HAS_SINKS:  # the sink columns' mass beside the keys' (a row with no key: its sink's alone, its weights still 0)
        sink = tl.load(SINK_LOGITS + a * ssn + rows * sst + h * ssh, mask=rows < T, other=float("-inf")).to(tl.float32)
        top = tl.maximum(tl.where(total > 0, best, float("-inf")), sink)
        top = tl.where(top == float("-inf"), 0.0, top)
        total = tl.where(total > 0, total * tl.exp(best - top), 0.0) + tl.exp(sink - top)
        best = top
    # a row with no key attended (a padded query): lse 0, its weights 0 and its entropy 0, as the torch path counts it
    tl.store(LSE + nh * T + rows, tl.where(total > 0, best + tl.log(tl.where(total > 0, total, 1.0)), 0.0),
             mask=rows < T)  # fmt: skip


@triton.jit
def _positional(BQ, BK, REF, PMAPS, PDIST, PFIRST, PROWS, PCOLS, PSQ, PSHIFT, mean_raw, bias, h, kh, m0, j0, rows,
                cols, dims, used, N: tl.constexpr, T, H, HD, scale, BLOCK, NB, SUB: tl.constexpr,
                TILE: tl.constexpr, HAS_BIAS: tl.constexpr = 1):  # fmt: skip
    """The positional logits of one tile, P = c Q·K / (N(N - 1)) - (s̄ - b) / (N - 1) + b (``mean_raw`` = s̄ - b,
    the mean of c q k^T), and their sums (fp64, added to): block sums (PMAPS), by distance of P - f and of its square
    (PDIST; of P itself where the bias is a row of keys, which changes along a diagonal), P at the keys j < 4 (PFIRST,
    stored: each cell is this program's), row and column sums below the diagonal (PROWS, PCOLS), Σ P² below and on it
    (PSQ), and Σ of P - ref and its square (PSHIFT, ref = REF[h])."""
    bq = load_rows(BQ, 0, h, rows, dims, 0, T * HD, HD, 1, T, HD)  # Q = Σ q, K = Σ k: (H, T, HD), (H_kv, T, HD)
    bk = load_rows(BK, 0, kh, cols, dims, 0, T * HD, HD, 1, T, HD)
    qk = tl.dot(bq, tl.trans(bk), input_precision="ieee") * scale
    dev = tl.where(used, qk * (1.0 / (N * (N - 1))) - mean_raw * (1.0 / (N - 1)), 0.0)  # P - f
    p = tl.where(used, dev + bias, 0.0)
    block_add(PMAPS + h * NB * NB, p, m0, j0, rows, cols, used, BLOCK, NB, SUB, TILE)
    if HAS_BIAS >= 2:
        dev = p
    add_diagonals(PDIST + h * T, dev, m0, j0, T, TILE)
    add_diagonals(PDIST + (H + h) * T, dev * dev, m0, j0, T, TILE)
    if j0 == 0:
        tl.store(PFIRST + (h * T + rows[:, None]) * 4 + cols[None, :], p.to(tl.float64),
                 mask=used & (cols[None, :] < 4))  # fmt: skip
    measure_sums(PROWS, PCOLS, PSQ, PSHIFT, p, tl.load(REF + h).to(tl.float64), used, h, rows, cols, T, H)


@triton.jit
def tile_statistics(Q, K, TABLE, LSE, MAPS, DIST, COLS, ROW_WS, SINKS, SCOLS, CTX, SDIST, SBLOCKS,
                    BQ, BK, REF, PMAPS, PDIST, PFIRST, PROWS, PCOLS, PSQ, PSHIFT, CELLS, CLASSES, BOUNDS,
                    sqn, sqh, sqt, sqd, skn, skh, skt, skd, N: tl.constexpr, T: tl.constexpr, H, GROUP, HD, scale,
                    cap, BLOCK, NB, W, NKT,
                    DP: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr,
                    SUB: tl.constexpr, POSITIONAL: tl.constexpr, MASKED: tl.constexpr,
                    BY_SAMPLE: tl.constexpr = False, SOFTCAP: tl.constexpr = False,
                    HID: tl.constexpr = 1):  # fmt: skip
    """K2: every accumulator of the module docstring, for one query tile and head; grid (ceil(T / BM), H).

    MAPS (4, H, NB, NB), DIST (6, H, T), COLS (2, H, T), ROW_WS (N, H, T), SINKS (N, H); per sample SCOLS (N, H, T),
    CTX (N, H, 10), SDIST (2, N, H, T), SBLOCKS (2, N, H, NB, NB); with ``POSITIONAL`` (N >= 2) from BQ = Σ q
    (H, T, HD) and BK = Σ k (H_kv, T, HD) fp32 contiguous and REF (H,) fp32: PMAPS (H, NB, NB), PDIST (2, H, T),
    PFIRST (H, T, 4), PROWS (H, T), PCOLS (H, T), PSQ (2, H), PSHIFT (2, H): fp64, added to. ``SUB``: how a
    tile meets the map's blocks (:func:`~biasviz.summaries.kernels.triton_tiles.block_add`): BM where BLOCK is a
    multiple of BM = BN (one sum a tile and map), BLOCK where it divides BM (one sum a block), 0 otherwise (one a
    cell)."""
    m0 = tl.program_id(0) * BM
    h = tl.program_id(1)
    kh = h // GROUP
    rows = m0 + tl.arange(0, BM)
    dims = tl.arange(0, DP)
    inv_n = 1.0 / N
    plane = NB * NB
    for j0 in range(0, T, BN):  # the key tiles up to the query tile's last row; those after it skipped
        cls = tile_class(CLASSES + N * NKT * NKT * BY_SAMPLE, m0, j0, NKT, BM, BN, MASKED)  # BY_SAMPLE: any sample's
        if (j0 < m0 + BM) & (cls != 0):
            cols = j0 + tl.arange(0, BN)
            # the tenths of a row's context (rows of at least 10 keys) the tile's cells can be in: floor(10 j / (i + 1))
            # at its corners (the least at the last row's first key, the most at the first row's last key)
            lo = (SEGMENTS * j0) // tl.minimum(m0 + BM, T)
            hi = tl.minimum((SEGMENTS * (j0 + BN - 1)) // (tl.maximum(m0, SEGMENTS - 1) + 1), SEGMENTS - 1)
            dw1 = tl.zeros([BM, BN], tl.float32)
            dw2 = tl.zeros([BM, BN], tl.float32)
            ds1 = tl.zeros([BM, BN], tl.float32)
            ds2 = tl.zeros([BM, BN], tl.float32)
            if BY_SAMPLE:  # each sample its own cells; each cell's moments over those that attend it
                cnt = tl.zeros([BM, BN], tl.float32)
                w0 = tl.zeros([BM, BN], tl.float32)  # the shift: the first attending sample's value
                raw0 = tl.zeros([BM, BN], tl.float32)
                for a in range(N):
                    mine = sample_cells(CELLS, CLASSES, a, m0, j0, rows, cols, T, W, NKT, BM, BN, MASKED, True)
                    raw, w = _sample_tile(Q, K, TABLE, LSE, ROW_WS, SINKS, SCOLS, CTX, SDIST, SBLOCKS, BOUNDS, COLS,
                                          a, h, kh, m0, j0, rows, cols, dims, mine, lo, hi, sqn, sqh, sqt, sqd, skn,
                                          skh, skt, skd, N, T, H, HD, scale, cap, BLOCK, NB, HAS_BIAS, SUB, BM,
                                          MASKED, True, SOFTCAP, HID)  # fmt: skip
                    first = mine & (cnt == 0.0)
                    w0 = tl.where(first, w, w0)
                    raw0 = tl.where(first, raw, raw0)
                    d = tl.where(mine, w - w0, 0.0)
                    dw1 += d
                    dw2 += d * d
                    d = tl.where(mine, raw - raw0, 0.0)
                    ds1 += d
                    ds2 += d * d
                    cnt += tl.where(mine, 1.0, 0.0)
                used = cnt > 0.0
                inv = 1.0 / tl.maximum(cnt, 1.0)  # 0 moments where no sample attends (every sum is 0 there)
            else:
                used = attended_cells(CELLS, cls, rows, cols, T, W, MASKED)
                # the first sample: the moments' shift
                raw0, w0 = _sample_tile(Q, K, TABLE, LSE, ROW_WS, SINKS, SCOLS, CTX, SDIST, SBLOCKS, BOUNDS, COLS, 0,
                                        h, kh, m0, j0, rows, cols, dims, used, lo, hi, sqn, sqh, sqt, sqd, skn, skh,
                                        skt, skd, N, T, H, HD, scale, cap, BLOCK, NB, HAS_BIAS, SUB, BM, MASKED,
                                        False, SOFTCAP, HID)  # fmt: skip
                for a in range(1, N):
                    raw, w = _sample_tile(Q, K, TABLE, LSE, ROW_WS, SINKS, SCOLS, CTX, SDIST, SBLOCKS, BOUNDS, COLS,
                                          a, h, kh, m0, j0, rows, cols, dims, used, lo, hi, sqn, sqh, sqt, sqd, skn,
                                          skh, skt, skd, N, T, H, HD, scale, cap, BLOCK, NB, HAS_BIAS, SUB, BM,
                                          MASKED, False, SOFTCAP, HID)  # fmt: skip
                    d = w - w0
                    dw1 += d
                    dw2 += d * d
                    d = raw - raw0  # the scores' differences without the bias: the same, to fewer roundings
                    ds1 += d
                    ds2 += d * d
                inv = tl.full([BM, BN], inv_n, tl.float32)
            # each cell's mean and population spread over the samples (0 past the diagonal: every sum is 0 there)
            mw = dw1 * inv
            var_w = tl.maximum(dw2 * inv - mw * mw, 0.0)
            mean_w = w0 + mw
            ms = ds1 * inv
            var_s = tl.maximum(ds2 * inv - ms * ms, 0.0)
            bias = tl.zeros([BM, BN], tl.float32)
            if HAS_BIAS:  # (a bias of each sample's own: its mean over samples, ē(i) - ē(j), for P)
                bias = tl.where(used, tile_bias(TABLE, N, h, rows, cols, T, H, HAS_BIAS, HID), 0.0)  # 0 if not used
            mean_s = raw0 + ms + bias
            mean_raw = raw0 + ms  # the mean of c q k^T
            if HAS_BIAS >= 6:  # the samples' scores held their own bias already
                mean_s = raw0 + ms
                mean_raw = mean_s - bias
            # block maps: a tile inside one block adds its sums (every cell past the diagonal holds 0), else each cell
            base = MAPS + h * plane
            stride = H * plane
            block_add(base, mean_w, m0, j0, rows, cols, used, BLOCK, NB, SUB, BM)
            block_add(base + stride, tl.sqrt(var_w), m0, j0, rows, cols, used, BLOCK, NB, SUB, BM)
            block_add(base + 2 * stride, mean_s, m0, j0, rows, cols, used, BLOCK, NB, SUB, BM)
            block_add(base + 3 * stride, tl.sqrt(var_s), m0, j0, rows, cols, used, BLOCK, NB, SUB, BM)
            # sums by distance d = i - j
            line = H * T
            add_diagonals(DIST + h * T, mean_w, m0, j0, T, BM)
            # the squares in fp64 from the fp32 means, as the torch path squares them: a distance of one cell (or one
            # sample's) then has a spread along it of exactly 0, not a float32 square's rounding
            mean_w64 = mean_w.to(tl.float64)
            add_diagonals(DIST + line + h * T, mean_w64 * mean_w64, m0, j0, T, BM)
            add_diagonals(DIST + 2 * line + h * T, var_w, m0, j0, T, BM)
            # the scores less a bias of distance, the same along a diagonal: Σ s̄² - (Σ s̄)² / n of an ALiBi diagonal
            # far out would cancel the spread along it in float32 (a bias of the key changes along it: kept in)
            along = raw0 + ms
            if HAS_BIAS >= 2:
                along = mean_s
            add_diagonals(DIST + 3 * line + h * T, along, m0, j0, T, BM)
            mean_raw64 = along.to(tl.float64)
            add_diagonals(DIST + 4 * line + h * T, mean_raw64 * mean_raw64, m0, j0, T, BM)
            add_diagonals(DIST + 5 * line + h * T, var_s, m0, j0, T, BM)
            # the weights' column sums (each key's share over the queries): Σ_i w̄ and Σ_i (σ² + w̄²), in fp64 as the
            # squares by distance: a key one query sees (the last) then has a spread over queries of exactly 0, not a
            # float32 square's rounding (sqrt(6e-8) of its weight)
            if not BY_SAMPLE:  # (BY_SAMPLE: each sample's went in as it came)
                tl.atomic_add(COLS + h * T + cols, tl.sum(mean_w64, 0), mask=cols < T)
                tl.atomic_add(COLS + (H + h) * T + cols, tl.sum(var_w.to(tl.float64) + mean_w64 * mean_w64, 0),
                              mask=cols < T)  # fmt: skip
            if POSITIONAL:
                _positional(BQ, BK, REF, PMAPS, PDIST, PFIRST, PROWS, PCOLS, PSQ, PSHIFT, mean_raw, bias, h, kh, m0,
                            j0, rows, cols, dims, used, N, T, H, HD, scale, BLOCK, NB, SUB, BM, HAS_BIAS)  # fmt: skip
