"""Each sample's block means of one quantity, for the standard error of a block map's mean (docs/position-measures.md).

A map's block value is the mean over samples of each sample's mean over the block's attended cells; its SE needs
each sample's block mean, not the per-cell spread (cells of one block move together). A query block whose rows all
come in one block of rows is folded at once: its per-sample means x_a go into Σ x_a and Σ x_a² (float64, additive,
so a block of rows formed again can be held back and dropped, :mod:`biasviz.summaries.pending`). Only a query block
that straddles two blocks of rows is carried, its samples' sums (S, H, nb), until its last row has come. Kept: two
(H, nb, nb) float64 arrays and at most a few carried query blocks, whatever N is.

With blocks of one position (R >= T) a sample's block mean is its cell, so the SE follows from the stored per-cell
spread itself, std / sqrt(N - 1) (:func:`errors_from_spread`), and nothing is kept.

Rows that bring the cells they attend (a mask of the call's own as the model streams it; each sample's own where samples
are masked differently: padding, packed documents) count them: a sample's block mean is over its own attended cells of
the block, its cells counted beside its sums, and each block's SE is over the samples that attend some cell of it (NaN
below 3), as every mean over samples of such a layer. Rows that bring none attend the call's rule: its one mask given
up front (rows formed again know it before the first row), else the causal triangle or every cell.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from biasviz.adapters.rows import plain_cells
from biasviz.store.datasets import MIN_SE_SAMPLES, SAMPLES_PER_CELL, map_name, se_name
from biasviz.summaries.attended import Attended
from biasviz.summaries.maps import _group_sums, geometry_counts
from biasviz.summaries.pending import Pending

KINDS = ("bias", "weights", "scores")
Pooled = list[tuple[int, torch.Tensor]]  # sums by block: (first key block, (B, H, query blocks, key blocks))


class SampleBlocks(Pending):
    """Σ x_a and Σ x_a² over samples of each sample's block means x_a of one quantity of one layer."""

    def __init__(self, *, heads: int, seq_len: int, block: int, causal: bool, device: torch.device,
                 attended: Attended | None = None) -> None:  # fmt: skip
        self.heads, self.seq_len, self.block, self.causal = heads, seq_len, block, causal
        self.attended, self.device = attended, device
        self.n_blocks = nb = -(-seq_len // block)
        # (1 or H, nb, nb) the attended cells of each block, as the map divides by them
        counts = geometry_counts(seq_len, block, causal)[None] if attended is None else attended.block_counts(block)
        self.counts = counts.to(device=device, dtype=torch.float64)
        self.n = torch.zeros(nb, dtype=torch.float64, device=device)  # samples folded, per query block
        self.sums = torch.zeros(2, heads, nb, nb, dtype=torch.float64, device=device)  # Σ x_a, Σ x_a²
        self.carry: dict[int, torch.Tensor] = {}  # straddling query block -> (S, H, nb) each sample's sums so far
        self._first, self._size = 0, 1  # the samples under way: ``first ..`` (``size`` of them)
        self.channels = heads  # sums carried per sample; counted: each head's sums, then its attended cells
        self.held: torch.Tensor | None = None  # counted: (H, nb, nb) the samples with a value in each block

    def _counted(self) -> None:
        """The first rows that bring their cells: from here each sample's cells are counted beside its sums; the
        samples folded so far count where the call's rule had cells. Comes between samples (what a sample brought
        before is folded, :meth:`begin`), never inside one."""
        if self.held is not None:
            return
        if self.carry:
            raise ValueError("rows that bring their cells come after rows of the same samples that brought none")
        with torch.inference_mode(False):  # called inside the model's forward: the sums outlive it
            had = (self.counts > 0).expand(self.heads, -1, -1)
            self.held = torch.where(had, self.n[None, :, None], 0.0)
            self.sums = self.sums.nan_to_num(0.0)
        self.channels = 2 * self.heads

    def widen(self) -> None:
        """The call's rule becomes every key, between batches. Every later block brings its own cells (:meth:`add`
        counts the samples before where the causal rule, or the one mask, had cells)."""
        self.causal = False

    def begin(self, first: int, size: int) -> None:
        """Samples ``first .. first + size - 1`` come next (a batch; every sample at once where rows are formed
        again); what is still carried is folded first."""
        self.finish(self.seq_len)
        self._first, self._size = first, size

    def pool(self, r0: int, values: torch.Tensor, cells: torch.Tensor | None = None) -> Pooled:
        """(B, H, rows, K) values -> their sums over attended cells by block: [(first key block, (B, H, nq, n))];
        ``cells`` (B or 1, 1 or H, rows, K): the cells the rows attend, counted after the sums (None: the call's
        rule)."""
        rows, keys = values.shape[-2:]
        b = self.block
        if values.dtype not in (torch.float32, torch.float64):  # a model's half precision: summed in float32
            values = values.float()

        def pooled(x: torch.Tensor, k0: int) -> torch.Tensor:  # in the values' precision: a sample's few cells
            return _group_sums(_group_sums(x, -2, r0, b), -1, k0, b)

        if cells is not None:  # the rows' own cells: their sums, then how many they are
            own = cells.to(values.device).expand_as(values)
            both = torch.cat([values.masked_fill(~own, 0.0), own.to(values.dtype)], dim=1)
            return [(0, pooled(both, 0))]
        if self.attended is not None:
            mask = self.attended.rows(r0, r0 + rows, keys).to(values.device)
            return [(0, pooled(values.masked_fill(~mask, 0.0), 0))]
        if not self.causal:
            return [(0, pooled(values, 0))]
        # causal: every key before r0 is seen by every row; the trailing square keeps its lower triangle only
        parts = [(0, pooled(values[..., :r0], 0))] if r0 > 0 else []
        square = values[..., r0 : r0 + rows].clone().tril_()
        return [*parts, (r0 // b, pooled(square, r0))]

    def add(self, first: int, r0: int, values: torch.Tensor, cells: torch.Tensor | None = None) -> Pooled:
        """Samples ``first ..``'s rows ``r0 ..`` (B, H, rows, K); cells not attended are left out (NaN, -inf, 0).
        ``cells`` (B or 1, 1 or H, rows, K): the cells the rows attend (None: the call's rule). Returns their sums by
        block, for another accumulator to take up (:meth:`add_sums`)."""
        if cells is not None:
            self._counted()
        elif self.held is not None:  # the call's rule, counted as the rows' own cells
            rows, keys = values.shape[-2:]
            cells = (plain_cells(r0, rows, keys, self.causal, values.device) if self.attended is None
                     else self.attended.rows(r0, r0 + rows, keys)[None])  # fmt: skip
        parts = self.pool(r0, values, cells)
        self.add_sums(first, r0, values.shape[-2], [(parts, 1.0)])
        return parts

    def add_sums(self, first: int, r0: int, rows: int, terms: list[tuple[Pooled, float]]) -> None:
        """Samples ``first ..``'s sums over the attended cells of blocks, rows ``r0 .. r0 + rows - 1``: the sum of
        each term's block sums times its weight. Query blocks wholly inside those rows are folded now; the others
        carried."""
        b = self.block
        q0, q1 = r0 // b, (r0 + rows - 1) // b + 1
        # (S, H, nq, width) float64, the key blocks up to the last any term reaches (a causal block of rows reaches
        # its own: half of the map on average, the rest of it untouched): a weighted combination of several terms
        # (P's jackknife) may be far smaller than they are; and the steps after it then mix no dtypes (a float32
        # operand of a float64 sum is cast to a temporary by every operation: 0.6 ms of 0.9 a call at 4096, R = 1024)
        width = max(k0 + sums.shape[3] for parts, _ in terms for k0, sums in parts)
        first_sums = terms[0][0][0][1]
        dense = torch.empty(first_sums.shape[0], self.channels, q1 - q0, width, dtype=torch.float64, device=self.device)
        written = 0  # dense[..., :written] holds sums; each term's parts come in key order
        for parts, weight in terms:
            for k0, sums in parts:
                n = sums.shape[3]
                if k0 > written:
                    dense[..., written:k0].zero_()
                over = max(0, min(written, k0 + n) - k0)  # its first key blocks, already written: added to
                if over:
                    dense[..., k0 : k0 + over].add_(sums[..., :over], alpha=weight)
                if over < n:
                    torch.mul(sums[..., over:], weight, out=dense[..., k0 + over : k0 + n])
                written = max(written, k0 + n)
        whole = [q for q in range(q0, q1) if q * b >= r0 and min((q + 1) * b, self.seq_len) <= r0 + rows]
        if whole:
            w0, w1 = whole[0], whole[-1] + 1
            self._fold(dense[:, :, w0 - q0 : w1 - q0], w0)  # in place: dense is this call's own
        at = slice(first - self._first, first - self._first + dense.shape[0])
        for q in range(q0, q1):
            if whole and whole[0] <= q <= whole[-1]:
                continue
            carry = self.carry.get(q)
            if carry is None:
                carry = self.carry[q] = torch.zeros(self._size, self.channels, self.n_blocks, dtype=torch.float64,
                                                    device=self.device)  # fmt: skip
            self._put(carry, (at, slice(None), slice(0, width)), dense[:, :, q - q0])

    def _fold(self, sums: torch.Tensor, q0: int) -> None:
        """Samples' complete sums (S, H, nq, width) of query blocks ``q0 ..`` over key blocks ``0 .. width - 1`` (those
        after have no attended cell): their means into Σ x and Σ x², added in place (held: into one buffer for every
        sample of the block of rows)."""
        nq, width = sums.shape[2:]
        rows, keys = slice(q0, q0 + nq), slice(0, width)
        if self.held is not None:  # each sample's mean over its own cells; none: no value
            count = sums[:, self.heads :]
            valid = count > 0
            x = torch.where(valid, sums[:, : self.heads] / count.clamp(min=1), 0.0)
            target = self._target(self.sums, (slice(None), slice(None), rows, keys))
            target[0] += x.sum(0)  # every sample at once: a few kernels on a GPU, whatever N
            target[1] += x.square().sum(0)
            self._put(self.held, (slice(None), rows, keys), valid.sum(0, dtype=torch.float64))
            return
        x = sums.div_(self.counts[:, rows, keys])  # NaN where a block has no attended cell; the sums are the caller's
        target = self._target(self.sums, (slice(None), slice(None), rows, keys))
        for one in x:  # a sample at a time: no (S, ...) square of it
            target[0] += one
            target[1].addcmul_(one, one)
        self._put(self.n, rows, torch.full((nq,), float(len(x)), dtype=torch.float64, device=self.device))

    def add_block_sums(self, sums: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Every sample's sums over each block's attended cells, (N, H, nb, nb), summed elsewhere (the fused
        kernels): folded at once. ``counts`` (N, 1 or H, nb, nb): how many of each sample's own cells each block holds
        (None: the call's rule)."""
        if counts is not None:
            self._counted()
            sums = torch.cat([sums, counts.to(sums).expand(-1, self.heads, -1, -1)], 1)
        self._fold(sums.to(self.sums, copy=True), 0)

    def finish(self, upto: int) -> None:
        """Fold the carried query blocks whose rows all lie before ``upto`` (every sample under way sent them)."""
        for q in sorted(self.carry):
            if min((q + 1) * self.block, self.seq_len) > upto:
                break
            self._fold(self.carry.pop(q)[:, :, None], q)

    def standard_error(self) -> np.ndarray | None:
        """(H, nb, nb) float32: sqrt(Σ (x_a - x̄)² / (N (N - 1))) over each sample's block mean; NaN where a block has
        no attended cell; None below 3 samples. Once only: the sums are used up."""
        self.finish(self.seq_len)
        if self.held is not None:  # no sample's rows came (a model that adds no bias sends none): none
            n = self.held
            if not bool((n > 0).any()):
                return None
            total, squares = self.sums
            spread = (squares - total.square() / n.clamp(min=1)).clamp(min=0.0)
            se = torch.where(n >= MIN_SE_SAMPLES, (spread / (n * (n - 1)).clamp(min=1)).sqrt(), float("nan"))
            return se.float().cpu().numpy()
        if int(self.n.min()) < MIN_SE_SAMPLES:
            return None
        n = self.n[None, :, None]
        total, squares = self.sums  # worked in place, a map's size each: the sums are not needed after
        spread = squares.sub_(total.square_().div_(n)).clamp_(min=0.0)  # Σ (x_a - x̄)²
        se = spread.div_(n * (n - 1)).sqrt_().masked_fill_(self.counts == 0, float("nan"))
        return se.float().cpu().numpy()


def sample_blocks(kinds: Iterable[str], *, heads: int, seq_len: int, block: int, causal: bool, samples: int,
                  device: torch.device, attended: Attended | None) -> dict[str, SampleBlocks]:  # fmt: skip
    """One accumulator per quantity of a layer whose every sample's rows will come (a bias summarised once while
    measured the same for every sample is not fed: :func:`map_errors`); none below 3 samples, or with blocks of one
    position (:func:`errors_from_spread`)."""
    if samples < MIN_SE_SAMPLES or block == 1:
        return {}
    out = {kind: SampleBlocks(heads=heads, seq_len=seq_len, block=block, causal=causal, device=device,
                              attended=attended) for kind in kinds}  # fmt: skip
    for b in out.values():  # every sample at once, unless batches say otherwise (SampleBlocks.begin)
        b.begin(0, samples)
    return out


def block_errors(blocks: dict[str, SampleBlocks]) -> dict[str, np.ndarray]:
    """``<kind>_mean_se`` of each accumulator that saw 3 samples or more."""
    return {se_name(map_name(kind)): se for kind, b in blocks.items() if (se := b.standard_error()) is not None}


def errors_from_spread(std: np.ndarray, samples: int) -> np.ndarray:
    """Blocks of one position: a sample's block mean is its cell, so SE = std / sqrt(N - 1) with the per-cell
    std over samples (ddof 0) the map stores (NaN stays NaN)."""
    return (std.astype(np.float64) / np.sqrt(samples - 1)).astype(np.float32)


def map_errors(measures: dict[str, Any], summaries: dict[str, Any], parts: dict[str, Any], *, samples: int,
               block: int) -> None:  # fmt: skip
    """Into ``measures``, the ``<kind>_mean_se`` of one layer that the accumulators did not give: with blocks of one
    position, from the stored spread (where samples are masked differently, each cell's over the samples that attend
    it: ``measures``' :data:`~biasviz.store.datasets.SAMPLES_PER_CELL`); a bias measured the same in every sample to
    the end, 0 on every block with an attended cell. A bias that turned out to differ part-way, its earlier rows
    summarised once for all, has none (as its profile's SE). Nothing below 3 samples."""
    if samples < MIN_SE_SAMPLES:
        return
    attending = measures.get(SAMPLES_PER_CELL)  # (H, nb, nb): samples masked differently
    for kind, summary in summaries.items():
        name = se_name(map_name(kind))
        if kind not in KINDS or name in measures:
            continue
        part = parts.get(kind)
        if block == 1:
            if attending is None:
                measures[name] = errors_from_spread(summary.std, samples)
            else:
                n = np.nan_to_num(np.asarray(attending, dtype=np.float64))
                with np.errstate(invalid="ignore", divide="ignore"):
                    se = summary.std.astype(np.float64) / np.sqrt(n - 1)
                measures[name] = np.where(n >= MIN_SE_SAMPLES, se, np.nan).astype(np.float32)
        elif part is not None and part.same_for_every_sample and attending is None:
            measures[name] = np.where(np.isnan(summary.mean), np.nan, 0.0).astype(np.float32)
