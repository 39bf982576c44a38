"""The mean attention distance's reducer on its own: blocks of rows, in steps of a few rows, with each sample's own
cells, against float64 numpy one query at a time; and its finish from the fused kernels' sums by distance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.store.datasets import ATTENTION_DISTANCE, se_name
from biasviz.summaries import attention_distance
from biasviz.summaries.attention_distance import AttentionDistance
from biasviz.summaries.reducers import KernelSums

N, H, T = 4, 3, 11


def _weights(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, H, T, T) softmax weights over each sample's own causal cells (sample 1 left-padded by 3: its first rows
    attend nothing), and those cells (N, 1, T, T)."""
    g = torch.Generator().manual_seed(seed)
    cells = torch.ones(N, 1, T, T, dtype=torch.bool).tril()
    cells[1, :, :, :3] = False
    cells[1, :, :3] = False
    z = torch.randn(N, H, T, T, generator=g).masked_fill(~cells, -torch.inf)
    return torch.softmax(z, -1).nan_to_num(0.0), cells


def _reference(w: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """(N, H): per sample and head, Σ_j w(i, j)·|i - j| averaged over the queries that attend some key."""
    out = np.zeros(w.shape[:2])
    for a in range(w.shape[0]):
        for h in range(w.shape[1]):
            rows = [i for i in range(T) if cells[a, 0, i].any()]
            out[a, h] = np.mean([sum(w[a, h, i, j] * abs(i - j) for j in range(T)) for i in rows])
    return out


@pytest.mark.parametrize("step_cells", [1 << 20, 7])  # one step a block; a few rows a step
def test_blocks_in_steps_over_each_sample_s_own_cells(step_cells: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention_distance, "STEP_CELLS", step_cells)
    w, cells = _weights(0)
    reducer = AttentionDistance(samples=N, heads=H, seq_len=T, block=1, causal=True, device=torch.device("cpu"))
    for a in range(N):
        for r0, r1 in ((0, 4), (4, 9), (9, T)):
            reducer.add(RowBlock(0, a, r0, w[a : a + 1, :, r0:r1, :r1], attended=cells[a : a + 1, :, r0:r1, :r1]))
    x = _reference(w.double().numpy(), cells.numpy())
    got = reducer.result()
    np.testing.assert_allclose(got[ATTENTION_DISTANCE], np.stack([x.mean(0), x.std(0)]), rtol=1e-6)
    np.testing.assert_allclose(got[se_name(ATTENTION_DISTANCE)], x.std(0, ddof=1) / np.sqrt(N), rtol=1e-5)


def test_from_the_kernels_sums_by_distance() -> None:
    """Σ_d d·(the weights at distance d) and the queries that look: what the fused kernels hold."""
    w, cells = _weights(1)
    d = np.subtract.outer(np.arange(T), np.arange(T))
    wn = w.double().numpy()
    by_distance = np.stack([[[wn[a, h][d == k].sum() for k in range(T)] for h in range(H)] for a in range(N)])
    looks = cells.any(-1).double()  # (N, 1, T)
    got = AttentionDistance.from_kernels(KernelSums(torch.from_numpy(by_distance), looks))
    x = _reference(wn, cells.numpy())
    np.testing.assert_allclose(got[ATTENTION_DISTANCE], np.stack([x.mean(0), x.std(0)]), rtol=1e-6)
