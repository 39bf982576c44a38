"""Each sample's distance profile, for the standard error of a stored profile's mean (docs/position-measures.md): per
sample, the sum of its values over the attended cells of every distance, (N, H, 2T - 1) sums, nothing of size T².

A block of rows is skewed into a buffer whose column is the distance (row r moved right by rows - 1 - r), so one
sum over rows gives every distance of the block at once, for every sample of the block.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from biasviz.store.datasets import MIN_SE_SAMPLES, profile_name, se_name
from biasviz.summaries.attended import Attended
from biasviz.summaries.pending import Pending


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
    """Per sample and head, sums by signed distance j - i + T - 1 (slot 0 .. 2T - 2) of one quantity's values."""

    def __init__(self, *, samples: int, heads: int, seq_len: int, causal: bool, device: torch.device,
                 attended: Attended | None = None) -> None:  # fmt: skip
        self.seq_len, self.causal, self.attended, self.device = seq_len, causal, attended, device
        self.sums = torch.zeros(samples, heads, 2 * seq_len - 1, dtype=torch.float64, device=device)
        self.count = torch.zeros(1 if attended is None else attended.mask.shape[0], 2 * seq_len - 1,
                                 dtype=torch.float64, device=device)  # fmt: skip
        self.seen = False  # whether any block came (a model that adds no bias sends none of it)

    batch_attended: torch.Tensor | None = None  # masks that differ by sample: the batch's (B or 1, 1 or H, T, T)
    by_samples = False

    def by_sample(self, first: int) -> None:
        """From sample ``first`` on, each sample's own cells (:attr:`batch_attended`) count for it: counts per
        sample, those before counted by the one mask they had."""
        before = self.counts()  # (1 or H, 2T - 1)
        with torch.inference_mode(False):
            self.count = torch.zeros(*self.sums.shape, dtype=torch.float64, device=self.device)
            self.count[:first] = before
        self.by_samples, self.attended = True, None

    def _mask(self, r0: int, rows: int, keys: int) -> torch.Tensor:
        if self.by_samples:  # (B or 1, 1 or H, rows, K)
            assert self.batch_attended is not None
            return self.batch_attended[..., r0 : r0 + rows, :keys].to(self.device)
        if self.attended is not None:
            return self.attended.rows(r0, r0 + rows, keys).to(self.device)
        i = torch.arange(r0, r0 + rows, device=self.device)[:, None]
        j = torch.arange(keys, device=self.device)[None, :]
        return (j <= i)[None] if self.causal else torch.ones(1, rows, keys, dtype=torch.bool, device=self.device)

    def _skew_sum(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, rows, K) -> (B, H, K + rows - 1): column c sums the cells with j - r = c - (rows - 1)."""
        b, h, rows, keys = x.shape
        width = keys + rows - 1
        z = torch.zeros(b, h, rows, width, dtype=x.dtype, device=x.device)
        z.as_strided(x.shape, (h * rows * width, rows * width, width - 1, 1), rows - 1).copy_(x)
        return z.sum(2).double()

    def add(self, first: int, r0: int, block: torch.Tensor) -> None:
        """Samples ``first ..``'s rows ``r0 ..`` (B, H, rows, K) against keys 0 .. K - 1; cells the call does not
        attend to are left out whatever they hold (NaN, 0)."""
        _, _, rows, keys = block.shape
        at = slice(first, first + block.shape[0])
        self.seen = True
        if self.attended is None and not self.by_samples and self.causal and r0 >= rows - 1 and keys >= r0 + rows:
            self._add_causal(at, r0, block)
            return
        mask = self._mask(r0, rows, keys)
        values = torch.where(mask, block, 0.0)
        start = self.seq_len - rows - r0  # the slot of column 0
        slots = slice(start, start + keys + rows - 1)
        self._put(self.sums, (at, slice(None), slots), self._skew_sum(values))
        if self.by_samples:  # each sample's own cells
            own = mask.expand(block.shape[0], *mask.shape[1:]).to(block.dtype)
            self._put(self.count, (at, slice(None), slots), self._skew_sum(own))
        elif first == 0 and self.attended is not None:  # the mask is the same for every sample: counted once
            self.count[:, slots] += self._skew_sum(mask[None].to(block.dtype))[0]

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
        """Every sample's sums by distance d = 0 .. T - 1, (N, H, T), of a causal call with no mask of its own, summed
        elsewhere (the fused kernels)."""
        self.sums[..., : self.seq_len] += sums.flip(-1).to(self.sums)
        self.seen = True

    def distance_sums(self) -> torch.Tensor:
        """(N, H, T) per sample, the sums over the attended cells at each distance d = |i - j| = 0 .. T - 1."""
        t = self.seq_len
        total = self.sums[..., :t].flip(-1)  # slot t - 1 - d holds i - j = d >= 0
        if not self.causal:
            total = total.clone()
            total[..., 1:] += self.sums[..., t:]  # slot t - 1 + e holds j - i = e > 0
        return total

    def counts(self) -> torch.Tensor:
        """(1 or H, 2T - 1): the attended cells of each slot (closed form where the call's mask is its rule); (N, H,
        2T - 1), each sample's own, where samples are masked differently."""
        if self.attended is not None or self.by_samples:
            return self.count
        t = self.seq_len
        e = torch.arange(2 * t - 1, device=self.device) - (t - 1)  # j - i
        cells = (t - e.abs()).double()
        if self.causal:
            cells = torch.where(e <= 0, cells, 0.0)
        return cells[None]

    def standard_error(self) -> torch.Tensor | None:
        """(H, T) for a causal call (distance 0 .. T - 1), (H, 2T - 1) for a bidirectional one (i - j from -(T - 1),
        as stored profiles run): the SE over samples of each sample's mean by distance; None with N < 3."""
        count = self.counts()
        per_sample = torch.where(count > 0, self.sums / count.clamp(min=1), float("nan"))
        _, se = sample_stats(per_sample)
        if se is None:
            return None
        se = se.flip(-1)  # slot 2T - 2 - k holds i - j = k - (T - 1)
        return se[:, self.seq_len - 1 :] if self.causal else se


def per_sample_profiles(parts: dict[str, Any], *, samples: int, heads: int, seq_len: int, causal: bool,
                        device: torch.device, attended: Attended | None) -> dict[str, SampleProfiles]:  # fmt: skip
    """One accumulator per quantity of a layer (``parts``: kind -> its QuantitySummary) whose profile gets an SE:
    none below 3 samples; a bias summarised once for all (declared the same, measured so far) has none: its SE is 0
    as long as it stays so (:func:`profile_errors`)."""
    if samples < MIN_SE_SAMPLES:
        return {}
    # the weights' own come with their measures (WeightMeasures.diagonals)
    kinds = [kind for kind, part in parts.items() if kind in ("scores", "bias") and part.mode != "shared"]
    return {kind: SampleProfiles(samples=samples, heads=heads, seq_len=seq_len, causal=causal, device=device,
                                 attended=attended) for kind in kinds}  # fmt: skip


def profile_errors(profiles: dict[str, SampleProfiles], parts: dict[str, Any], samples: int) -> dict[str, Any]:
    """``<kind>_profile_se`` arrays: each accumulator's SE; a bias measured the same in every sample to the end, 0;
    one that turned out to differ part-way has none (its rows before were summarised once for all)."""
    out = {se_name(profile_name(kind)): se.float().cpu().numpy() for kind, p in profiles.items()
           if (se := p.standard_error()) is not None}  # fmt: skip
    bias = parts.get("bias")
    if bias is not None and bias.mode == "shared" and samples >= MIN_SE_SAMPLES:
        width = bias.seq_len if bias.causal else 2 * bias.seq_len - 1
        out[se_name(profile_name("bias"))] = np.zeros((bias.heads, width), dtype=np.float32)
    return out
