"""The sink share as a reducer (:mod:`biasviz.summaries.sink_share`): each sample's mean weight on key 0 over the
queries that see key 0, against numpy, however the blocks come; named by the table, built with every summary."""

from __future__ import annotations

import numpy as np
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.store import datasets
from biasviz.summaries.reducers import KernelSums, build, kernel_results, measured, split
from biasviz.summaries.sink_share import SinkShare

N, H, T = 4, 2, 7
SIZES = {"heads": H, "seq_len": T, "block": 1, "causal": True, "device": torch.device("cpu")}


def _weights() -> tuple[np.ndarray, np.ndarray]:
    """(N, H, T, T) weights, 0 off their cells, and the cells: causal, but key 0 hidden from queries 0-2 of sample 3 in
    head 1 alone."""
    masks = np.broadcast_to(np.tril(np.ones((T, T), bool)), (N, H, T, T)).copy()
    masks[3, 1, :3, 0] = False
    return np.where(masks, np.random.default_rng(9).random((N, H, T, T)), 0.0), masks


def _want(w: np.ndarray, masks: np.ndarray) -> np.ndarray:
    return (w[..., 0] * masks[..., 0]).sum(-1) / masks[..., 0].sum(-1)


def _blocks(w: np.ndarray, masks: np.ndarray, samples: range, rows: int) -> list[RowBlock]:
    """Blocks of two samples and ``rows`` query rows: samples 0-1 bring no cells (the causal rule), 2-3 their own."""
    out = []
    for first in samples[::2]:
        for r0 in range(0, T, rows):
            r1 = min(T, r0 + rows)
            cells = torch.as_tensor(masks[first : first + 2, :, r0:r1, :r1]) if first >= 2 else None
            out.append(RowBlock(0, first - samples[0], r0, torch.as_tensor(w[first : first + 2, :, r0:r1, :r1]),
                                attended=cells))  # fmt: skip
    return out


def test_each_samples_share_over_the_cells_its_blocks_bring_and_held_blocks_count_once() -> None:
    w, masks = _weights()
    share = SinkShare(samples=N, **SIZES)
    for block in _blocks(w, masks, range(N), 3):
        share.hold()
        share.add(block)
        share.discard()  # formed again: the first addition dropped
        share.add(block)
    got = share.result()
    assert set(got) == {datasets.SINK_SHARE}
    np.testing.assert_allclose(got[datasets.SINK_SHARE], _want(w, masks), rtol=1e-6)


def test_processes_join_in_rank_order_one_of_them_counting_by_head() -> None:
    """torchrun: process 0 streams samples 0-1 (no cells of their own: one count for every head), process 1 samples
    2-3 (whose cells differ by head): joined, what one process gives."""
    w, masks = _weights()
    parts = [SinkShare(samples=2, **SIZES) for _ in range(2)]
    for rank, part in enumerate(parts):
        for block in _blocks(w, masks, range(2 * rank, 2 * rank + 2), 2):
            part.add(block)
    assert parts[0].sums["seeing"].shape[1] == 1 and parts[1].sums["seeing"].shape[1] == H
    joined = SinkShare(samples=2, **SIZES)
    joined.join([p.state() for p in parts])
    np.testing.assert_allclose(joined.result()[datasets.SINK_SHARE], _want(w, masks), rtol=1e-6)


def test_the_table_names_it_and_every_summary_builds_it() -> None:
    """Built whether or not docs/position-measures.md's measures are asked; its row goes with docs/positional.md's;
    from the kernels it is their own finished share."""
    assert datasets.SINK_SHARE in datasets.reduced_rows()
    assert datasets.SINK_SHARE not in datasets.MEASURE_ROWS
    alone = [type(r) for r in build(samples=N, measures=False, **SIZES)]
    assert SinkShare in alone and not any(measured(cls) for cls in alone)
    assert SinkShare in [type(r) for r in build(samples=N, **SIZES)]
    assert SinkShare not in [type(r) for r in build(samples=N, measures=False, held={datasets.SINK_SHARE}, **SIZES)]
    positional, measures = split({datasets.SINK_SHARE: np.zeros(1), datasets.BAND_MASS: np.zeros(1),
                                  "sink_min_queries": 3})  # fmt: skip
    assert list(positional) == [datasets.SINK_SHARE] and set(measures) == {datasets.BAND_MASS, "sink_min_queries"}
    finished = torch.rand(N, H)
    sums = KernelSums(by_distance=torch.zeros(N, H, T), finished={datasets.SINK_SHARE: finished})
    got = kernel_results(sums, measures=False)
    assert list(got) == [datasets.SINK_SHARE] and np.array_equal(got[datasets.SINK_SHARE], finished.numpy())
    assert datasets.SINK_SHARE not in kernel_results(sums, measures=True)
