"""The standard error of a block map's mean (docs/position-measures.md): each sample's block mean, recomputed here in
float64 from the cells themselves, against what SampleBlocks folds from blocks of rows in any order of batches."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from biasviz.summaries.attended import Attended
from biasviz.summaries.sample_blocks import SampleBlocks, errors_from_spread
from tests.measures_reference import map_se


def counts_of(mask: np.ndarray, block: int) -> torch.Tensor:
    """(1 or H, nb, nb) attended cells per block, counted here from the mask."""
    t = mask.shape[-1]
    nb = -(-t // block)
    out = np.zeros((mask.shape[0], nb, nb))
    for qb in range(nb):
        for kb in range(nb):
            out[:, qb, kb] = mask[:, qb * block : (qb + 1) * block, kb * block : (kb + 1) * block].sum((-1, -2))
    return torch.from_numpy(out)


N, H, T = 5, 2, 23


def replay(blocks: SampleBlocks, n: int, t: int, rows: Callable[[int, int, int], tuple[torch.Tensor, ...]]) -> None:
    """As rows formed again: every sample's rows ``rows(a, r0, r1)`` (values, and cells where they bring them) of a
    block of rows one after another, held and committed; the block of row 7, formed twice (discarded once), counts
    once."""
    blocks.begin(0, n)
    for r0, r1 in ((0, 7), (7, 8), (8, t)):
        for attempt in range(2 if r0 == 7 else 1):
            blocks.hold()
            for a in range(n):
                blocks.add(a, r0, *rows(a, r0, r1))
            if attempt == 0 and r0 == 7:
                blocks.discard()
            else:
                blocks.commit()
        blocks.finish(r1)


@pytest.mark.parametrize("block", [2, 3, 5])
@pytest.mark.parametrize("layout", ["causal", "window", "bidirectional"])
def test_block_errors_from_rows_in_batches_and_per_sample(block: int, layout: str) -> None:
    rng = np.random.default_rng(block)
    x = rng.normal(size=(N, H, T, T)) * rng.uniform(0.5, 2, size=(1, H, 1, 1))
    i, j = np.indices((T, T))
    mask = {"causal": j <= i, "window": (j <= i) & (i - j < 4), "bidirectional": np.ones((T, T), bool)}[layout][None]
    values = np.where(mask[None], x, np.nan if layout == "causal" else -np.inf)  # what a call leaves out: never read
    if layout == "bidirectional":
        values = x
    expected = map_se(x, mask, block)
    attended = Attended(torch.from_numpy(mask)) if layout == "window" else None
    causal = layout != "bidirectional"
    blocks = SampleBlocks(heads=H, seq_len=T, block=block, causal=causal, device=torch.device("cpu"), attended=attended)
    assert torch.equal(blocks.counts.expand(H, -1, -1), counts_of(mask, block).expand(H, -1, -1))

    def fresh() -> SampleBlocks:
        return SampleBlocks(heads=H, seq_len=T, block=block, causal=causal, device=torch.device("cpu"),
                            attended=attended)  # fmt: skip

    v = torch.from_numpy(values).float()
    # as a stream: batches of 2, 2, 1 samples, rows in uneven blocks, every key of the row
    streamed = fresh()
    for first, size in ((0, 2), (2, 2), (4, 1)):
        streamed.begin(first, size)
        for r0, r1 in ((0, 4), (4, 11), (11, T)):
            keys = r1 if causal else T
            streamed.add(first, r0, v[first : first + size, :, r0:r1, :keys])
            streamed.finish(r1)
    np.testing.assert_allclose(streamed.standard_error(), expected, rtol=2e-5, atol=1e-7)
    # as rows formed again: every sample of a block of rows one after another, held and committed; a block formed
    # twice (discarded once) counts once
    replayed = fresh()
    replay(replayed, N, T, lambda a, r0, r1: (v[a : a + 1, :, r0:r1, : r1 if causal else T],))
    np.testing.assert_allclose(replayed.standard_error(), expected, rtol=2e-5, atol=1e-7)


def test_two_samples_give_no_block_errors() -> None:
    blocks = SampleBlocks(heads=1, seq_len=4, block=2, causal=True, device=torch.device("cpu"))
    blocks.begin(0, 2)
    blocks.add(0, 0, torch.ones(2, 1, 4, 4))
    assert blocks.standard_error() is None


def test_blocks_of_one_position_read_the_spread() -> None:
    x = np.random.default_rng(0).normal(size=(6, 2, 5, 5))
    std = x.std(0).astype(np.float32)
    np.testing.assert_allclose(errors_from_spread(std, 6), map_se(x, np.ones((1, 5, 5), bool), 1), rtol=1e-6)


def own_block_se(x: np.ndarray, cells: np.ndarray, block: int) -> np.ndarray:
    """(H, nb, nb): each sample's mean over its own cells of a block, and their SE over the samples that have a cell
    there (NaN below 3): recomputed here cell by cell in float64."""
    n, h, t, _ = x.shape
    nb = -(-t // block)
    out = np.full((h, nb, nb), np.nan)
    for qb in range(nb):
        for kb in range(nb):
            rows, keys = slice(qb * block, (qb + 1) * block), slice(kb * block, (kb + 1) * block)
            for head in range(h):
                means = [x[a, head, rows, keys][cells[a, rows, keys]].mean() for a in range(n)
                         if cells[a, rows, keys].any()]  # fmt: skip
                if len(means) >= 3:
                    m = np.array(means)
                    out[head, qb, kb] = np.sqrt(((m - m.mean()) ** 2).sum() / (len(m) * (len(m) - 1)))
    return out


def padded_cells(n: int, t: int, seed: int) -> np.ndarray:
    """(N, T, T): causal cells of each sample after its own left padding (a pad key is seen by no query)."""
    pads = np.random.default_rng(seed).integers(0, t // 2, size=n)
    i, j = np.indices((t, t))
    return np.stack([(j <= i) & (j >= p) for p in pads])


@pytest.mark.parametrize("block", [2, 3, 5])
def test_rows_that_bring_each_samples_own_cells_count_them(block: int) -> None:
    rng = np.random.default_rng(block)
    n = 7
    x = rng.normal(size=(n, H, T, T))
    cells = padded_cells(n, T, block)
    cells[2] = np.tril(np.ones((T, T), bool))  # one sample without padding
    expected = own_block_se(x, cells, block)
    v = torch.from_numpy(np.where(cells[:, None], x, np.nan)).float()
    c = torch.from_numpy(cells)[:, None]  # (N, 1, T, T)

    def fresh() -> SampleBlocks:
        return SampleBlocks(heads=H, seq_len=T, block=block, causal=True, device=torch.device("cpu"))

    streamed = fresh()  # batches of 3, 3, 1, rows in uneven blocks
    for first, size in ((0, 3), (3, 3), (6, 1)):
        streamed.begin(first, size)
        for r0, r1 in ((0, 4), (4, 11), (11, T)):
            at = slice(first, first + size)
            streamed.add(first, r0, v[at, :, r0:r1, :r1], c[at, :, r0:r1, :r1])
            streamed.finish(r1)
    np.testing.assert_allclose(streamed.standard_error(), expected, rtol=2e-5, atol=1e-7)

    replayed = fresh()  # one sample at a time, a block of rows held and discarded once
    replay(replayed, n, T, lambda a, r0, r1: (v[a : a + 1, :, r0:r1, :r1], c[a : a + 1, :, r0:r1, :r1]))
    np.testing.assert_allclose(replayed.standard_error(), expected, rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("mask", ["causal", "window"])
def test_samples_without_cells_then_samples_with_their_own(mask: str) -> None:
    """The first batch attends the call's rule (its blocks bring no cells); later samples bring their own padding."""
    block, n = 3, 6
    rng = np.random.default_rng(11)
    x = rng.normal(size=(n, H, T, T))
    i, j = np.indices((T, T))
    rule = (j <= i) & ((i - j < 6) if mask == "window" else True)
    cells = padded_cells(n, T, 5) & rule
    cells[:2] = rule  # the first batch: the rule
    expected = own_block_se(x, cells, block)
    v = torch.from_numpy(np.where(cells[:, None], x, np.nan)).float()
    attended = Attended(torch.from_numpy(rule)[None]) if mask == "window" else None
    blocks = SampleBlocks(heads=H, seq_len=T, block=block, causal=True, device=torch.device("cpu"), attended=attended)
    for first, size in ((0, 2), (2, 3), (5, 1)):
        blocks.begin(first, size)
        for r0, r1 in ((0, 5), (5, T)):
            at = slice(first, first + size)
            own = None if first == 0 else torch.from_numpy(cells[at, None, r0:r1, :r1])
            blocks.add(first, r0, v[at, :, r0:r1, :r1], own)
            blocks.finish(r1)
    np.testing.assert_allclose(blocks.standard_error(), expected, rtol=2e-5, atol=1e-7)


def test_one_mask_brought_by_the_rows_gives_the_numbers_of_the_mask_given_up_front() -> None:
    """A mask of the call's own, brought by every block or given before the first row: the same block means, counted
    block by block or from the mask's counts made once."""
    block, n = 4, 5
    rng = np.random.default_rng(3)
    i, j = np.indices((T, T))
    rule = (j <= i) & (i - j < 7)
    v = torch.from_numpy(np.where(rule, rng.normal(size=(n, H, T, T)), np.nan)).float()
    given = SampleBlocks(heads=H, seq_len=T, block=block, causal=True, device=torch.device("cpu"),
                         attended=Attended(torch.from_numpy(rule)[None]))  # fmt: skip
    brought = SampleBlocks(heads=H, seq_len=T, block=block, causal=True, device=torch.device("cpu"))
    for first, size in ((0, 2), (2, 3)):
        for blocks in (given, brought):
            blocks.begin(first, size)
        for r0, r1 in ((0, 6), (6, T)):
            rows = v[first : first + size, :, r0:r1, :r1]
            given.add(first, r0, rows)
            brought.add(first, r0, rows, torch.from_numpy(rule[None, None, r0:r1, :r1]))
            for blocks in (given, brought):
                blocks.finish(r1)
    expected = map_se(v.double().nan_to_num(0.0).numpy(), rule[None], block)
    got = brought.standard_error()
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=1e-7)
    np.testing.assert_allclose(got, given.standard_error(), rtol=1e-6)


def test_rows_in_half_precision_are_summed_in_float32() -> None:
    """A model run in bfloat16 streams its weights so: a block's mean of 400 such cells is not summed in bfloat16."""
    block, n, t = 20, 4, 20
    rng = np.random.default_rng(0)
    x = (1.0 + 0.01 * rng.normal(size=(n, 1, t, t))).astype(np.float32)
    half = torch.from_numpy(x).bfloat16()
    blocks = SampleBlocks(heads=1, seq_len=t, block=block, causal=False, device=torch.device("cpu"))
    blocks.begin(0, n)
    blocks.add(0, 0, half, torch.ones(1, 1, t, t, dtype=torch.bool))
    expected = map_se(half.double().numpy(), np.ones((1, t, t), bool), block)
    np.testing.assert_allclose(blocks.standard_error(), expected, rtol=1e-4)
