"""The standard error of a block map's mean (docs/position-measures.md): each sample's block mean, recomputed here in
float64 from the cells themselves, against what SampleBlocks folds from blocks of rows in any order of batches."""

from __future__ import annotations

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
    replayed.begin(0, N)
    for r0, r1 in ((0, 7), (7, 8), (8, T)):
        for attempt in range(2 if r0 == 7 else 1):
            replayed.hold()
            for a in range(N):
                keys = r1 if causal else T
                replayed.add(a, r0, v[a : a + 1, :, r0:r1, :keys])
            if attempt == 0 and r0 == 7:
                replayed.discard()
            else:
                replayed.commit()
        replayed.finish(r1)
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
