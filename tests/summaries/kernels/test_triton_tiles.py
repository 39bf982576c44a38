"""What the fused kernels do within one tile (:mod:`biasviz.summaries.kernels.triton_tiles`), each Triton function run
alone on one tile by a kernel of this file's, on the CPU under Triton's interpreter, against float64 numpy taken cell
by cell: the bias of every form, the scores, the softcap, the attended cells, and the tile's sums by block, by
distance and for the diagnostics. The tiles sit on the diagonal, below it and past T.

Skipped where Triton is not installed (``pip install 'biasviz[gpu]'``; CI installs it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.kernels.biases import MlpBias, SampleEnds, SampleKeys
from biasviz.summaries.kernels.masks import sample_operands
from tests.summaries.fused_reference import documents, padded, window

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
tiles = pytest.importorskip("biasviz.summaries.kernels.triton_tiles")
tile_bias, tile_scores, capped, sample_cells = tiles.tile_bias, tiles.tile_scores, tiles.capped, tiles.sample_cells
block_add, add_diagonals, measure_sums = tiles.block_add, tiles.add_diagonals, tiles.measure_sums

TILE, T, H = 16, 40, 3
PLACES = [(0, 0), (16, 0), (16, 16), (32, 16), (32, 32)]  # (m0, j0): on the diagonal, below it, rows past T


@triton.jit
def _bias(TABLE, OUT, a, h, m0, j0, T, H, KIND: tl.constexpr, HID: tl.constexpr, TILE: tl.constexpr):
    r = tl.arange(0, TILE)
    b = tile_bias(TABLE, a, h, m0 + r, j0 + r, T, H, KIND, HID)
    tl.store(OUT + r[:, None] * TILE + r[None, :], b)


@triton.jit
def _scores(Q, K, TABLE, OUT, a, h, kh, m0, j0, sqn, sqh, sqt, sqd, skn, skh, skt, skd, T, H, HD, scale,
            HAS_BIAS: tl.constexpr, TILE: tl.constexpr, DP: tl.constexpr):  # fmt: skip
    r = tl.arange(0, TILE)
    s = tile_scores(Q, K, TABLE, a, h, kh, m0 + r, j0 + r, tl.arange(0, DP), sqn, sqh, sqt, sqd, skn, skh, skt,
                          skd, T, H, HD, scale, HAS_BIAS, 1)  # fmt: skip
    tl.store(OUT + r[:, None] * TILE + r[None, :], s)


@triton.jit
def _capped(S, OUT, cap, n, SOFTCAP: tl.constexpr, BLOCK: tl.constexpr):
    at = tl.arange(0, BLOCK)
    s = tl.load(S + at, mask=at < n, other=0.0)
    tl.store(OUT + at, capped(s, cap, SOFTCAP), mask=at < n)


@triton.jit
def _cells(CELLS, CLASSES, OUT, a, m0, j0, T, W, NKT, TILE: tl.constexpr, MASKED: tl.constexpr,
           BY_SAMPLE: tl.constexpr):  # fmt: skip
    r = tl.arange(0, TILE)
    got = sample_cells(CELLS, CLASSES, a, m0, j0, m0 + r, j0 + r, T, W, NKT, TILE, TILE, MASKED, BY_SAMPLE)
    tl.store(OUT + r[:, None] * TILE + r[None, :], got.to(tl.int8))


@triton.jit
def _sums(X, MAPS, DIST, ROWS, COLS, SQ, SHIFT, ref, h, m0, j0, T, H, BLOCK, NB, SUB: tl.constexpr,
          TILE: tl.constexpr):  # fmt: skip
    r = tl.arange(0, TILE)
    rows, cols = m0 + r, j0 + r
    used = (cols[None, :] <= rows[:, None]) & (rows[:, None] < T)
    x = tl.where(used, tl.load(X + r[:, None] * TILE + r[None, :]), 0.0)
    block_add(MAPS, x, m0, j0, rows, cols, used, BLOCK, NB, SUB, TILE)
    add_diagonals(DIST, x, m0, j0, T, TILE)
    measure_sums(ROWS, COLS, SQ, SHIFT, x, ref, used, h, rows, cols, T, H)


def _tile(full: np.ndarray, m0: int, j0: int) -> np.ndarray:
    """The (TILE, TILE) tile at (m0, j0) of a (T, T) array: its causal cells inside T, 0 elsewhere."""
    out = np.zeros((TILE, TILE))
    i, j = np.indices((TILE, TILE))
    i, j = i + m0, j + j0
    inside = (j <= i) & (i < T)
    out[inside] = full[i[inside], j[inside]]
    return out


def _run_bias(kind: int, table: torch.Tensor, a: int, h: int, m0: int, j0: int, hid: int = 1) -> np.ndarray:
    out = torch.full((TILE, TILE), float("nan"))
    _bias[(1,)](table.float().contiguous(), out, a, h, m0, j0, T, H, KIND=kind, HID=hid, TILE=TILE)
    return out.double().numpy()


def _fire(hidden: int = 5) -> tuple[MlpBias, np.ndarray]:
    """FIRE's terms with random weights (c = 0.4, L = 6), and its (H, T, T) float64 cells from them."""
    rng = np.random.default_rng(3)
    positions = np.arange(T, dtype=np.float64)
    psi_d, psi_i = np.log1p(0.4 * positions), np.log1p(0.4 * np.maximum(positions, 6.0))
    w1, b1, w2, b2 = rng.normal(size=hidden), rng.normal(size=hidden), rng.normal(size=(H, hidden)), rng.normal(size=H)
    i, j = np.indices((T, T))
    u = psi_d[np.clip(i - j, 0, None)] / psi_i[i]
    cells = np.moveaxis(np.maximum(u[..., None] * w1 + b1, 0) @ w2.T + b2, -1, 0)
    terms = MlpBias(*(torch.from_numpy(x).float() for x in (psi_d, psi_i, w1, b1, w2, b2)))
    return terms, cells


@pytest.mark.parametrize(("m0", "j0"), PLACES)
def test_every_form_of_bias_is_its_cells_on_the_causal_cells_and_0_elsewhere(interpreter, m0: int, j0: int) -> None:
    rng = np.random.default_rng(m0 * 100 + j0)
    i, j = np.indices((T, T))
    f, g = rng.normal(size=(H, T)), rng.normal(size=(H, T))
    ends, keys = rng.normal(size=(2, H, T)).cumsum(-1), rng.normal(size=(2, H, T))
    per_head, shared = rng.normal(size=(H, T, T)), rng.normal(size=(1, T, T))
    terms, fire = _fire()
    cases = [  # kind, what the kernel reads, sample, the (H, T, T) cells of that sample
        (1, torch.from_numpy(f), 0, f[:, np.clip(i - j, 0, None)]),  # a table of distance f(i - j)
        (2, torch.from_numpy(g), 0, np.broadcast_to(g[:, None, :], (H, T, T))),  # a row of keys g(j)
        (3, terms.packed(torch.device("cpu")), 0, fire),  # FIRE's MLP formed cell by cell
        (4, torch.from_numpy(shared), 0, np.broadcast_to(shared, (H, T, T))),  # cells, one for every head
        (5, torch.from_numpy(per_head), 0, per_head),  # cells, each head's own
        (6, SampleEnds(torch.from_numpy(ends)).packed(torch.device("cpu")), 1, ends[1][:, :, None] - ends[1][:, None]),
        (6, SampleEnds(torch.from_numpy(ends)).packed(torch.device("cpu")), 2,  # index N: the mean over samples
         ends.mean(0)[:, :, None] - ends.mean(0)[:, None]),
        (7, SampleKeys(torch.from_numpy(keys)).packed(torch.device("cpu")), 1,
         np.broadcast_to(keys[1][:, None], (H, T, T))),
    ]  # fmt: skip
    for kind, table, a, cells in cases:
        for h in range(H):
            got = _run_bias(kind, table, a, h, m0, j0, hid=terms.w1.numel() if kind == 3 else 1)
            np.testing.assert_allclose(got, _tile(cells[h], m0, j0), rtol=2e-5, atol=2e-5, err_msg=f"kind {kind}")


@pytest.mark.parametrize(("m0", "j0"), PLACES)
@pytest.mark.parametrize("bias", [False, True])
def test_a_tile_s_scores_are_c_q_k_plus_the_bias(interpreter, m0: int, j0: int, bias: bool) -> None:
    """Grouped queries (head 2 reads key head 1), a head dim of 24 padded to 32, q and k in any layout."""
    rng = np.random.default_rng(m0 + j0 + bias)
    q, k = rng.normal(size=(2, T, H, 24)), rng.normal(size=(2, 2, T, 24))  # q as (N, T, H, hd): strides of its own
    f = rng.normal(size=(H, T))
    out = torch.full((TILE, TILE), float("nan"))
    qt, kt = torch.from_numpy(q).float(), torch.from_numpy(k).float()
    _scores[(1,)](qt, kt, torch.from_numpy(f).float(), out, 1, 2, 1, m0, j0, qt.stride(0), qt.stride(2), qt.stride(1),
                  qt.stride(3), *kt.stride(), T, H, 24, 0.3, HAS_BIAS=int(bias), TILE=TILE, DP=32)  # fmt: skip
    i, j = np.indices((T, T))
    s = 0.3 * q[1, :, 2] @ k[1, 1].T + (np.where(j <= i, f[2, np.clip(i - j, 0, None)], 0.0) if bias else 0.0)
    want = np.pad(s, ((0, TILE), (0, TILE)))[m0 : m0 + TILE, j0 : j0 + TILE]  # 0 past T (rows and keys loaded as 0)
    np.testing.assert_allclose(out.double().numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cap", [0.7, 30.0, 1e4])
def test_the_softcap_is_float64_s_cap_tanh_of_s_over_cap_to_float32_s_rounding(interpreter, cap: float) -> None:
    """Scores on both sides of 0, across |s / cap| = 1/8 (where the series gives way to the exponentials), tiny and
    far beyond the cap."""
    s = np.concatenate([np.geomspace(1e-7, 50, 120) * cap, [0.0, 0.125 * cap, 0.1249 * cap, 0.1251 * cap]])
    s = np.concatenate([s, -s]).astype(np.float32)
    out = torch.empty(len(s))
    _capped[(1,)](torch.from_numpy(s), out, cap, len(s), SOFTCAP=True, BLOCK=512)
    want = cap * np.tanh(s.astype(np.float64) / cap)
    np.testing.assert_allclose(out.double().numpy(), want, rtol=4e-7, atol=1e-12)
    plain = torch.empty(len(s))
    _capped[(1,)](torch.from_numpy(s), plain, cap, len(s), SOFTCAP=False, BLOCK=512)
    assert torch.equal(plain, torch.from_numpy(s))


@pytest.mark.parametrize("cells", [window(T, 7), documents(T, [0, 13, 30]), np.tril(np.ones((T, T), dtype=bool))])
def test_a_tile_s_attended_cells_are_the_mask_s_whatever_its_class(interpreter, cells: np.ndarray) -> None:
    """Classes 0, 1 and 2 among the tiles (a class-1 tile reads no bit); and the causal rule with no mask."""
    go = sample_operands(torch.from_numpy(cells[None]), TILE)
    nkt = go["classes"].shape[-1]
    for m0 in range(0, T, TILE):
        for j0 in range(0, T, TILE):
            for masked in (True, False):
                out = torch.full((TILE, TILE), 7, dtype=torch.int8)
                _cells[(1,)](go["cells"][0].contiguous(), go["classes"][0].contiguous(), out, 0, m0, j0, T, go["width"],
                             nkt, TILE=TILE, MASKED=masked, BY_SAMPLE=False)  # fmt: skip
                rule = cells if masked else np.tril(np.ones((T, T), dtype=bool))
                want = np.pad(rule, ((0, TILE), (0, TILE)))[m0 : m0 + TILE, j0 : j0 + TILE]
                np.testing.assert_array_equal(out.numpy().astype(bool), want, err_msg=f"tile ({m0}, {j0}) {masked}")


def test_each_sample_s_cells_are_its_own(interpreter) -> None:
    cells = padded(T, [0, 19, 5], [0, 0, 9])
    go = sample_operands(torch.from_numpy(cells), TILE)
    nkt = go["classes"].shape[-1]
    for a in range(3):
        for m0 in range(0, T, TILE):
            for j0 in range(0, m0 + 1, TILE):
                out = torch.full((TILE, TILE), 7, dtype=torch.int8)
                _cells[(1,)](go["cells"].contiguous(), go["classes"].contiguous(), out, a, m0, j0, T, go["width"], nkt,
                             TILE=TILE, MASKED=True, BY_SAMPLE=True)  # fmt: skip
                want = np.pad(cells[a], ((0, TILE), (0, TILE)))[m0 : m0 + TILE, j0 : j0 + TILE]
                np.testing.assert_array_equal(out.numpy().astype(bool), want, err_msg=f"sample {a} ({m0}, {j0})")


@pytest.mark.parametrize(("block", "sub"), [(32, 16), (48, 16), (8, 8), (4, 4), (12, 0), (5, 0), (40, 0)])
@pytest.mark.parametrize(("m0", "j0"), [(16, 0), (16, 16), (32, 16)])  # below the diagonal, on it, rows past T
def test_a_tile_s_sums_by_block_by_distance_and_for_the_diagnostics(interpreter, block: int, sub: int, m0: int,
                                                                    j0: int) -> None:  # fmt: skip
    """``sub`` as the kernels choose it (:func:`~biasviz.summaries.kernels._sub_blocks`): the tile inside one block
    (TILE), blocks splitting the tile, or each cell to its block (0)."""
    from biasviz.summaries.kernels import _sub_blocks

    assert _sub_blocks(block, TILE) == sub
    rng = np.random.default_rng(block + m0 + j0)
    x = rng.normal(size=(TILE, TILE)).astype(np.float32)
    nb, h, ref = -(-T // block), 1, 0.25
    out = {"maps": np.zeros((nb, nb)), "dist": np.zeros(T), "rows": np.zeros((H, T)), "cols": np.zeros((H, T)),
           "sq": np.zeros((2, H)), "shift": np.zeros((2, H))}  # fmt: skip
    got = {name: torch.from_numpy(value.copy()) for name, value in out.items()}
    _sums[(1,)](torch.from_numpy(x), *got.values(), ref, h, m0, j0, T, H, block, nb, SUB=sub, TILE=TILE)
    i, j = np.indices((TILE, TILE))
    i, j = i + m0, j + j0
    used = (j <= i) & (i < T)
    x = np.where(used, x.astype(np.float64), 0.0)
    for r, c, v in zip(i[used], j[used], x[used], strict=True):
        out["maps"][r // block, c // block] += v
        out["dist"][r - c] += v
        if c < r:
            out["rows"][h, r] += v
            out["cols"][h, c] += v
            out["sq"][0, h] += v * v
        if c == r:
            out["sq"][1, h] += v * v
        out["shift"][0, h] += v - ref
        out["shift"][1, h] += (v - ref) ** 2
    for name, want in out.items():
        np.testing.assert_allclose(got[name].numpy(), want, rtol=1e-6, atol=1e-6, err_msg=name)
