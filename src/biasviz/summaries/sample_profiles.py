"""Each sample's distance profile, for the standard error of a stored profile's mean (docs/position-measures.md): per
sample, the sum of its values over the attended cells of every distance, (N, H, 2T - 1) sums, nothing of size T².

A block of rows is skewed into a buffer whose column is the distance (row r moved right by rows - 1 - r), so one
sum over rows gives every distance of the block at once, for every sample of the block.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch

from biasviz.adapters.rows import plain_cells
from biasviz.store.datasets import MIN_SE_SAMPLES, profile_name, se_name
from biasviz.summaries.pending import Pending

COUNT_ROWS = 256  # rows of a call's cells counted at a time where nothing else comes with them (float64 temporaries)


def sample_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample values (N, ...) -> ((2, ...) mean and std over samples (ddof 0), SE or None with N < 3).

    The SE sqrt(Σ (x_a - x̄)² / (N (N - 1))) is the delete-one jackknife of a mean. A sample with NaN there (nothing
    it attends to: samples masked differently) is left out of that entry, N its samples with a value; an entry no
    sample has, or (SE) fewer than 3, is NaN.

    >>> stats, se = sample_stats(torch.tensor([[1.0, 1.0], [3.0, float("nan")], [5.0, 2.0]], dtype=torch.float64))
    >>> stats.tolist(), se.tolist()
    ([[3.0, 1.5], [1.632993161855452, 0.5]], [1.1547005383792515, nan])
    """
    n_all = x.shape[0]
    held = ~torch.isnan(x)
    n = held.sum(0).to(x.dtype)
    mean = torch.where(held, x, 0.0).sum(0) / n
    dev2 = torch.where(held, x - mean, 0.0).square().sum(0)
    std = (dev2 / n).sqrt()
    se = None
    if n_all >= MIN_SE_SAMPLES:
        se = torch.where(n >= MIN_SE_SAMPLES, (dev2 / (n * (n - 1)).clamp(min=1)).sqrt(), float("nan"))
    return torch.stack([mean, std]), se


class SampleProfiles(Pending):
    """Per sample and head, sums by signed distance j - i + T - 1 (slot 0 .. 2T - 2) of one quantity's values, and
    each sample's attended cells at each slot: the cells each block brings (its own, or the call's one mask, or the
    causal triangle or every cell where it brings none), so samples masked alike and samples masked differently are
    counted the same way, with nothing to switch part-way."""

    def __init__(self, *, samples: int, heads: int, seq_len: int, causal: bool, device: torch.device) -> None:
        self.seq_len, self.causal, self.device = seq_len, causal, device
        self.sums = torch.zeros(samples, heads, 2 * seq_len - 1, dtype=torch.float64, device=device)
        # (N, 1 or H, 2T - 1): one head until a block's cells differ by head
        self.count = torch.zeros(samples, 1, 2 * seq_len - 1, dtype=torch.float64, device=device)
        self.seen = False  # whether any block came (a model that adds no bias sends none of it)

    def widen(self) -> None:
        """The call's rule becomes every key (:meth:`Reducer.widen <biasviz.summaries.reducers.Reducer.widen>`): the
        slots after the query count from here on; what each sample counted so far stands."""
        self.causal = False

    def _skew_sum(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, rows, K) -> (B, H, K + rows - 1): column c sums the cells with j - r = c - (rows - 1)."""
        b, h, rows, keys = x.shape
        width = keys + rows - 1
        z = torch.zeros(b, h, rows, width, dtype=x.dtype, device=x.device)
        z.as_strided(x.shape, (h * rows * width, rows * width, width - 1, 1), rows - 1).copy_(x)
        return z.sum(2).double()

    def add(self, first: int, r0: int, block: torch.Tensor, cells: torch.Tensor | None = None) -> None:
        """Samples ``first ..``'s rows ``r0 ..`` (B, H, rows, K) against keys 0 .. K - 1, over ``cells`` (1 or B,
        1 or H, rows, K) bool, the cells they attend to (None: the causal triangle, or every cell); cells not attended
        to are left out whatever they hold (NaN, 0)."""
        b, _, rows, keys = block.shape
        at = slice(first, first + b)
        self.seen = True
        cells = None if cells is None else cells.to(block.device)
        self._count(at, r0, rows, keys, None if cells is None else cells.to(block.dtype))
        if cells is None:
            if self.causal and r0 >= rows - 1 and keys >= r0 + rows:
                self._add_causal(at, r0, block)
                return
            cells = plain_cells(r0, rows, keys, self.causal, block.device)
        values = torch.where(cells, block, 0.0)
        start = self.seq_len - rows - r0  # the slot of column 0
        self._put(self.sums, (at, slice(None), slice(start, start + keys + rows - 1)), self._skew_sum(values))

    def _count(self, at: slice, r0: int, rows: int, keys: int, cells: torch.Tensor | None) -> None:
        """Rows ``r0 ..``'s attended cells at each slot into the counts of samples ``at``: ``cells`` (1 or B, 1 or H,
        rows, K) as numbers, or None, the call's rule, in closed form (made once a block for every sample)."""
        if cells is None:
            plain = plain_slot_counts(self.seq_len, r0, rows, keys, self.causal, self.device)
            self._put(self.count, (at,), plain)
            return
        self.count = self._widened(self.count, cells.shape[1])
        start = self.seq_len - rows - r0  # the slot of column 0
        self._put(self.count, (at, slice(None), slice(start, start + keys + rows - 1)), self._skew_sum(cells))

    def _add_causal(self, at: slice, r0: int, block: torch.Tensor) -> None:
        """A causal block past the first rows, read in place: distances 0 .. r0, which every row reaches, as a
        strided view (row r's keys r .. r + r0, a row stride one longer); the longer ones of the first rows - 1 keys
        (j < r) through a small skewed copy. Cells after a row's query are never read."""
        b, h, rows, _ = block.shape
        st = block.stride()
        every = block.as_strided((b, h, rows, r0 + 1), (st[0], st[1], st[2] + st[3], st[3]), block.storage_offset())
        t = self.seq_len
        self._put(self.sums, (at, slice(None), slice(t - 1 - r0, t)), every.sum(2).double())  # column c: d = r0 - c
        if rows > 1:
            first_keys = block[..., : rows - 1]
            r = torch.arange(rows, device=block.device)[:, None]
            lower = torch.arange(rows - 1, device=block.device)[None, :] < r  # j < r: not in the view above
            start = t - rows - r0
            skewed = self._skew_sum(torch.where(lower, first_keys, 0.0))
            self._put(self.sums, (at, slice(None), slice(start, start + 2 * rows - 2)), skewed)

    def add_distance_sums(self, sums: torch.Tensor) -> None:
        """Every sample's sums by distance d = 0 .. T - 1, (N, H, T), of a causal call, summed elsewhere (the fused
        kernels); their cells are counted by :meth:`count_cells`."""
        self.sums[..., : self.seq_len] += sums.flip(-1).to(self.sums)
        self.seen = True

    def count_cells(self, first: int, samples: int, cells: torch.Tensor | None) -> None:
        """The attended cells at each slot of samples ``first .. first + samples - 1``, from the call's cells alone
        (1 or S, 1 or H, T, T; None: the causal triangle, or every cell), a few rows at a time: where the values were
        summed elsewhere, counted as :meth:`add` counts a block's."""
        t, at = self.seq_len, slice(first, first + samples)
        for r0 in range(0, t, COUNT_ROWS):
            rows = min(COUNT_ROWS, t - r0)
            keys = r0 + rows if self.causal else t
            part = None if cells is None else cells[..., r0 : r0 + rows, :keys].to(self.device, torch.float64)
            self._count(at, r0, rows, keys, part)

    def distance_sums(self) -> torch.Tensor:
        """(N, H, T) per sample, the sums over the attended cells at each distance d = |i - j| = 0 .. T - 1."""
        t = self.seq_len
        total = self.sums[..., :t].flip(-1)  # slot t - 1 - d holds i - j = d >= 0
        if not self.causal:
            total = total.clone()
            total[..., 1:] += self.sums[..., t:]  # slot t - 1 + e holds j - i = e > 0
        return total

    def state(self) -> dict[str, torch.Tensor]:
        """This process's per-sample sums and counts, on the CPU (torchrun: joined on process 0 by :meth:`join`)."""
        return {"sums": self.sums.cpu(), "count": self.count.cpu()}

    def join(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Every process's :meth:`state` in rank order: their samples one after another."""
        heads = max(s["count"].shape[1] for s in states)
        self.sums = torch.cat([s["sums"] for s in states]).to(self.device)
        self.count = torch.cat([s["count"].expand(-1, heads, -1) for s in states]).to(self.device)

    def standard_error(self) -> torch.Tensor | None:
        """(H, T) for a causal call (distance 0 .. T - 1), (H, 2T - 1) for a bidirectional one (i - j from -(T - 1),
        as stored profiles run): the SE over samples of each sample's mean by distance; None with N < 3."""
        count = self.count
        per_sample = torch.where(count > 0, self.sums / count.clamp(min=1), float("nan"))
        _, se = sample_stats(per_sample)
        if se is None:
            return None
        se = se.flip(-1)  # slot 2T - 2 - k holds i - j = k - (T - 1)
        return se[:, self.seq_len - 1 :] if self.causal else se


@functools.lru_cache(maxsize=4)
def plain_slot_counts(seq_len: int, r0: int, rows: int, keys: int, causal: bool, device: torch.device) -> torch.Tensor:
    """(1, 1, 2T - 1) float64, not to be written to: the cells of rows ``r0 ..`` against ``keys`` keys at each slot
    j - i + T - 1, causal (keys up to the row) or every key; worked out once per block for every sample and quantity.

    >>> plain_slot_counts(3, 1, 2, 3, True, torch.device("cpu")).tolist()  # rows 1, 2: j - i = -2 once, -1, 0 twice
    [[[1.0, 2.0, 2.0, 0.0, 0.0]]]
    """
    e = torch.arange(2 * seq_len - 1, device=device) - (seq_len - 1)  # j - i
    lo = torch.clamp(-e, min=r0)  # the first row i >= r0 with j = i + e >= 0
    hi = torch.clamp(keys - e, max=r0 + rows)  # one past the last with j < K
    if causal:
        hi = torch.where(e <= 0, hi, lo)
    return (hi - lo).clamp(min=0).double()[None, None]


def per_sample_profiles(parts: dict[str, Any], *, samples: int, heads: int, seq_len: int, causal: bool,
                        device: torch.device) -> dict[str, SampleProfiles]:  # fmt: skip
    """One accumulator per quantity of a layer (``parts``: kind -> its QuantitySummary) whose profile gets an SE:
    none below 3 samples; a bias summarised once for all (declared the same, measured so far) has none: its SE is 0
    as long as it stays so (:func:`profile_errors`)."""
    if samples < MIN_SE_SAMPLES:
        return {}
    # the weights' own come with their measures (WeightMeasures.diagonals)
    kinds = [kind for kind, part in parts.items() if kind in ("scores", "bias") and not part.shared]
    return {kind: SampleProfiles(samples=samples, heads=heads, seq_len=seq_len, causal=causal, device=device)
            for kind in kinds}  # fmt: skip


def profile_errors(profiles: dict[str, SampleProfiles], parts: dict[str, Any], samples: int) -> dict[str, Any]:
    """``<kind>_profile_se`` arrays: each accumulator's SE; a bias measured the same in every sample to the end, 0;
    one that turned out to differ part-way has none (its rows before were summarised once for all)."""
    out = {se_name(profile_name(kind)): se.float().cpu().numpy() for kind, p in profiles.items()
           if (se := p.standard_error()) is not None}  # fmt: skip
    bias = parts.get("bias")
    if bias is not None and bias.same_for_every_sample and samples >= MIN_SE_SAMPLES:
        width = bias.seq_len if bias.causal else 2 * bias.seq_len - 1
        out[se_name(profile_name("bias"))] = np.zeros((bias.heads, width), dtype=np.float32)
    return out
