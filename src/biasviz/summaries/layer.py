"""One layer's bias or weights, summarised as the model forms them: maps, profile and (bias) diagnostics.

Two things set how a part summarises, each decided once:

- where the samples' values of a cell meet (:attr:`QuantitySummary.store`, :mod:`biasviz.summaries.moments`):
  ``joint``, one batch holds every sample, so each block of rows gives its per-cell mean and spread at once and
  nothing of size T² is kept (whenever the maps are coarser than cells); ``cells``, maps exact per cell (R >= T) with
  samples in several batches, or samples masked differently: per-cell moments are kept (the size of the result) and
  summarised at the end. Chosen before the first row; a shared part's, when it ends (below).
- whether a bias declared context-free is still summarised once (:attr:`QuantitySummary.shared`): the first sample's
  values stand for all, spread 0, for as long as every sample's, compared with the first's as it comes
  (:mod:`biasviz.summaries.sharing`), equals it; the first that differs ends it for good, and the part summarises
  every sample from that block on, exactly as if it had from the start (every row before was the same in every
  sample, as measured). Over several batches the first sample's rows were kept to compare with: its per-cell moments
  start from them (``cells``); in one batch it goes on block by block (``joint``).

The plan (:mod:`biasviz.extraction.summary_plan`) names a part's start ``shared``, ``joint`` or ``cells``
(:data:`MODES`; :attr:`QuantitySummary.mode` reads it back).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.common.errors import BiasvizError
from biasviz.common.shapes import host_arrays, step_cells
from biasviz.store.format import non_finite_error
from biasviz.summaries.attended import Attended, cells_before
from biasviz.summaries.diagonals import DiagonalSums, MaskedDiagonalSums, UpperDiagonalSums
from biasviz.summaries.maps import BlockMaps, zero_above_
from biasviz.summaries.measures import BiasMeasureSums
from biasviz.summaries.moments import CellMoments, Moments
from biasviz.summaries.scratch import Scratch
from biasviz.summaries.sharing import Agreement

MODES = ("shared", "joint", "cells")
CELLS_PER_STEP = 1 << 22  # cells (heads x rows x keys) summarised at a time: bounds the temporaries
# Over a model's own mask the separability residual solves L s = g with L (T, T): 2 s at T = 2048 on 2 cores, and
# T^3 beyond; longer calls store it as NaN (full files give it at any length through diagnose)
MASKED_SEPARABILITY_LEN = 2048


@dataclass
class Summary:
    """What a file keeps of one quantity of one layer (docs/hdf5.md, 'Summary files')."""

    mean: np.ndarray  # (H, nb, nb) float32
    std: np.ndarray  # (H, nb, nb) float32
    profile: np.ndarray  # (2, H, T) float32: mean, std by distance
    diagnostics: np.ndarray | None  # (H,) records of DIAGNOSTIC_FIELDS, bias only
    difference: float | None = None  # a bias declared shared: the largest |b_a - b_0| measured (sharing.py)


class QuantitySummary:
    """Receives blocks of query rows of one quantity (``bias`` or ``weights``) of one layer."""

    def __init__(self, kind: str, layer: int, *, heads: int, seq_len: int, block: int, causal: bool, mode: str,
                 device: torch.device, samples: int | None = None) -> None:  # fmt: skip
        """``samples``: how many will come (None: unknown); a shared part keeps the first sample's rows to compare
        later batches with only when they come in more than one batch."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.kind, self.layer = kind, layer
        self.shared = mode == "shared"  # declared the same for every sample and, so far, measured so
        self.store = "cells" if mode == "cells" else "joint"  # a shared part's is settled when it is measured to differ
        self.heads, self.seq_len, self.causal, self.block, self.device = heads, seq_len, causal, block, device
        self.attended: Attended | None = None  # a model's own mask, where it is not the causal triangle
        self._sums()
        self.cells = CellMoments(heads, seq_len, device) if mode == "cells" else None
        self.agreement = Agreement(device) if mode == "shared" else None  # declared the same for all: measured
        self.samples = 0  # samples seen so far (batches ended)
        self._expected = samples
        self._batch = 0  # samples in the current batch
        self._taken = False  # shared: the one bias has been summarised
        self._first: torch.Tensor | None = None  # shared over several batches: the first sample's rows (H, T, T)
        self._keep = False  # whether to keep them

    def _sums(self) -> None:
        """New running sums (maps, diagonals, bias measures): nothing added yet."""
        heads, seq_len, device = self.heads, self.seq_len, self.device
        self.maps = BlockMaps(heads, seq_len, self.block, device, ("mean", "std"), causal=self.causal)
        self.diagonals = DiagonalSums(heads, seq_len, device)
        self.masked = None if self.attended is None else MaskedDiagonalSums(heads, seq_len, device, self.attended)
        if self.attended is not None:  # each block averages its attended cells
            self.maps.set_counts(self.attended.block_counts(self.block))
        self.measures = BiasMeasureSums(heads, seq_len, device) if self.kind in ("bias", "positional") else None
        # a bidirectional model's Toeplitz residual also runs along the diagonals after the query (docs/hdf5.md,
        # 'Attended cells')
        self.upper = UpperDiagonalSums(heads, seq_len, device) if self.measures and not self.causal else None

    def attend(self, attended: Attended) -> None:
        """Summarise over the cells of a model's own mask (docs/hdf5.md, 'Attended cells') rather than the causal
        triangle; before any row is added."""
        if self.diagonals.count.sum() > 0:
            raise ValueError("a mask is set before any row is added")
        self.attended = attended
        self._sums()

    sample_masks = False  # masks that differ by sample: per-cell moments over each cell's own samples

    def by_sample(self) -> None:
        """From the batch under way on, samples are masked differently (padding, packed documents; docs/hdf5.md, 'The
        cells a call attends to'): each cell's mean and spread are over the samples that attend it, kept per cell, and
        the maps, profiles and diagnostics are taken at the end over the cells some sample attends; each block's rows
        bring their samples' cells (:meth:`add`). The samples summarised so far attended the one mask they had
        (:meth:`attend`), or the call's rule. A bias declared shared is no longer compared."""
        before = None
        if self.samples:
            before = cells_before(self.attended, self.seq_len, self.causal)
        self.stop_comparing()
        if self.store == "joint":  # one batch holds every sample: none summarised yet
            if self.samples or self.diagonals.count.sum() > 0:
                raise ValueError("a joint part changes to per-sample masks before any row")
            self.store = "cells"
            self.cells = CellMoments(self.heads, self.seq_len, self.device)
        assert self.cells is not None
        with torch.inference_mode(False):  # called inside the model's forward: the moments outlive it
            self.cells.count_cells(before)
            self.sample_masks, self.attended = True, None
            self._sums()

    def widen(self) -> None:
        """The call, summarised as causal so far, turned out to attend keys after a query (a streamed call;
        docs/hdf5.md, 'Attended cells'): from the batch under way on, it is a call that sees every key within each
        sample's own cells. The samples before attended the causal triangle (or the one mask they had): they are kept
        as samples masked differently keep theirs (:meth:`by_sample`), and the sums run over both sides of the
        diagonal, every one taken at the end from the per-cell moments."""
        if not self.sample_masks:
            self.by_sample()
        self.causal = False
        self._sums()

    @property
    def mode(self) -> str:
        """The plan's name for where the part stands: ``shared`` while a declared bias is measured the same in every
        sample, else its :attr:`store`."""
        return "shared" if self.shared else self.store

    def stop_comparing(self) -> None:
        """Each sample summarised over its own cells, as its own values (samples masked differently, a bias of each
        sample's own row of keys): a bias declared shared is summarised per sample and no longer compared."""
        if self.shared:
            self.unshare()
        self.agreement = None

    @property
    def difference(self) -> float | None:
        """The largest |b_a - b_0| over samples and used cells measured so far; None where not declared shared."""
        return None if self.agreement is None else self.agreement.largest

    def begin_batch(self, samples: int) -> None:
        self._batch = samples
        # a later batch is compared with the first sample's rows: kept, as one batch of one would hold them
        if self.samples == 0:
            self._keep = self.agreement is not None and (self._expected is None or samples < self._expected)

    def end_batch(self) -> None:
        self.samples += self._batch
        if self.cells is not None:
            self.cells.end_batch(self._batch)
        if self.shared and self.samples:
            self._taken = True

    def add_block(self, block: RowBlock) -> None:
        """A streamed block's rows of this part's kind, over the cells it says: the call's one mask (:attr:`RowBlock.
        mask`, taken before the first row), or from the first block whose samples are masked differently on
        (:attr:`RowBlock.by_sample`), each sample's own."""
        values = block.of(self.kind)
        if values is None:
            return
        if block.by_sample and not self.sample_masks:
            self.by_sample()
        elif block.mask is not None and self.attended is None and not self.sample_masks:
            self.attend(block.mask)
        self.add(block.r0, values, block.attended)

    def add(self, row0: int, block: torch.Tensor, cells: torch.Tensor | None = None) -> None:
        """A block (S or 1, H, rows, K) of query rows ``row0 ..`` against keys ``0 .. K-1``, as formed; ``cells`` (S or
        1, 1 or H, rows, K): the cells its samples attend, read once they are masked differently (:meth:`by_sample`;
        before, the one mask of :meth:`attend` counts)."""
        if self.agreement is not None:  # declared the same for every sample: measured, shared or not by now
            self._measure(row0, block)
            if self.shared:
                if self.agreement.largest == 0.0:
                    if not self._taken:
                        self.add_moments(row0, block[:1])
                    return
                self.unshare()
        if block.shape[0] == 1 and self._batch > 1:  # one tensor for the whole batch (a broadcast mask)
            block = block.expand(self._batch, *block.shape[1:])
        # a few rows at a time: the float64 temporaries of a whole batch's block would be (S, H, T, T)
        step = max(1, step_cells(block.device, CELLS_PER_STEP) // max(1, block.shape[1] * block.shape[-1]))
        if self.store == "cells":
            assert self.cells is not None
            rows, keys = block.shape[-2:]
            for r in range(0, rows, step):
                part = block[..., r : r + step, :]
                kept = None
                if self.sample_masks:  # each sample's own cells
                    assert cells is not None, "samples masked differently bring their cells with their rows"
                    kept = cells[..., r : r + part.shape[-2], :keys].to(block.device)
                self.cells.add(row0 + r, part, kept)
            return
        if block.shape[0] == 1:
            self.add_moments(row0, block)
            return
        for r in range(0, block.shape[-2], step):
            m = Moments.of(block[:, :, r : r + step])
            self.add_moments(row0 + r, torch.stack([m.mean, m.std()]), owned=True)

    def _measure(self, row0: int, block: torch.Tensor) -> None:
        """Compare ``block``'s samples with the first sample's rows (the first batch's first, kept while later
        batches are to come), into :attr:`agreement`."""
        assert self.agreement is not None
        rows, keys = block.shape[-2:]
        if self.samples == 0:  # the first batch: its first sample is the reference
            first, others = block[:1], block[1:]
            if self._keep:
                if self._first is None:
                    self._first = torch.zeros(self.heads, self.seq_len, self.seq_len, dtype=block.dtype,
                                              device=block.device)  # fmt: skip
                self._first[:, row0 : row0 + rows, :keys] = block[0]
        else:
            assert self._first is not None, "a shared part over several batches keeps its first sample's rows"
            first, others = self._first[None, :, row0 : row0 + rows, :keys], block
        self.agreement.compare(first, others, row0 if self.causal else None)
        self.agreement.settle()

    def unshare(self) -> None:
        """Measured to differ: summarise every sample from here on. Rows summarised before held the same values in
        every sample, so the first's values with spread 0 are what a per-sample summary has of them: a part fed
        block by block (``joint``) goes on from there; one whose batches meet in per-cell moments (``cells``)
        starts them from the first's values, m2 = 0, over the samples seen, and its running sums anew."""
        self.shared = False
        if self._first is None:
            return
        self.store = "cells"
        with torch.inference_mode(False):  # called inside the model's forward: the sums outlive it
            self.cells = CellMoments(self.heads, self.seq_len, self.device)
            self.cells.mean.copy_(self._first)
            self._sums()  # cells are summarised at the end, every row at once
        self.cells.samples = self.samples

    def restart(self) -> None:
        """Back to no row added, for a layer formed again from its first row; a bias declared the same for every
        input is summarised per sample from then on (it was measured to differ: :class:`~biasviz.summaries.replay.
        DiffersPartWay`). What it measured stays."""
        if self.shared:
            self.unshare()
        self._taken = False
        self._sums()

    def add_moments(self, row0: int, values: torch.Tensor, owned: bool = False, scratch: Scratch | None = None) -> None:
        """Per-cell mean and, if ``values`` (S, H, rows, K) holds two, spread over samples of rows ``row0 ..``, into
        every running sum (one: the same for every sample). ``owned``: the caller gives ``values`` up, so that
        they are changed in place rather than copied; ``scratch``: the caller's memory for the temporaries."""
        rows, keys = values.shape[-2:]
        step = max(1, step_cells(values.device, CELLS_PER_STEP) // max(1, self.heads * keys))
        if rows > step:
            for r in range(0, rows, step):
                cut = row0 + r + step if self.causal else keys  # a causal row block uses no key past its last row
                self.add_moments(row0 + r, values[..., r : r + step, :cut], owned, scratch)
            return
        if self.causal and keys > row0 + rows:  # keys no query of these rows sees
            values = values[..., : row0 + rows]
        if self.attended is not None:
            self._add_attended(row0, values)
            return
        # weights are 0 wherever a query does not look; a bias holds values (or NaN) there, to be left out
        if self.causal and self.kind != "weights":
            values = zero_above_(values if owned else values.clone())
        self.maps.add(row0, values)  # whether every value was finite: read once, in result()
        self.diagonals.add(row0, values, scratch)
        if self.measures is not None:
            self.measures.add(row0, values, self.causal, scratch)
        if self.upper is not None:
            self.upper.add(row0, values)

    def _add_attended(self, row0: int, values: torch.Tensor) -> None:
        """Rows over a model's own mask: the cells left out are 0 in every sum (NaN or whatever they held gone) and
        out of every count."""
        assert self.attended is not None and self.masked is not None
        rows, keys = values.shape[-2:]
        mask = self.attended.rows(row0, row0 + rows, keys).to(values.device)  # (1 or H, rows, K)
        values = values.masked_fill(~mask, 0.0)
        self.maps.add(row0, values)
        self.masked.add(row0, values, mask)
        if self.measures is not None:
            self.measures.add(row0, values, self.causal, mask=mask)

    given: Summary | None = None  # the layer's summary formed by another implementation (the fused kernels)
    given_differs = False  # ... of a bias that differs by sample (its spread and SEs measured, not 0)

    @property
    def same_for_every_sample(self) -> bool:
        """A bias known the same in every sample: declared so and measured to the end (``shared``), or given whole from
        the one a forward kept and compared, exactly, with every sample's (the fused path's table): its SEs are 0."""
        return self.kind == "bias" and (self.shared or (self.given is not None and not self.given_differs))

    def result(self, total_samples: int | None = None) -> Summary:
        """The finished summary; ``total_samples`` (all processes') decides whether context dependence is defined."""
        if self.given is not None:
            return self.given
        if self.sample_masks:  # every quantity over the cells some sample attends (docs/hdf5.md, 'Attended cells')
            assert self.cells is not None
            self.attend(Attended(self.cells.attended()))
        if self.cells is not None:
            step = max(1, step_cells(self.device, CELLS_PER_STEP) // max(1, self.heads * self.seq_len))
            for r0 in range(0, self.seq_len, step):
                r1 = min(self.seq_len, r0 + step)
                mean, spread = self.cells.rows(r0, r1, r1 if self.causal else self.seq_len)
                self.add_moments(r0, torch.stack([mean, spread]), owned=True)
        if self.diagonals.count.sum() == 0 and not (self.masked is not None and self.masked.seen):  # no row arrived
            raise BiasvizError(f"nothing was captured for the {self.kind} of layer {self.layer}")
        if not self.maps.finite():  # NaN or infinite in a used cell, anywhere in the layer
            raise non_finite_error(self.kind, self.layer)
        n = self.samples if total_samples is None else total_samples
        diagnostics = None
        if self.measures is not None:
            # P is one matrix over all samples: it has no spread of its own, so no context dependence
            if self.masked is not None:
                assert self.attended is not None
                # s_i - s_j over a mask's own pairs: a (T, T) least-squares solve, up to MASKED_SEPARABILITY_LEN
                fit = self.attended.laplacian() if self.seq_len <= MASKED_SEPARABILITY_LEN else False
                diagnostics = self.measures.results(0 if self.kind == "positional" else n, self.masked.toeplitz_rss(),
                                                    fit)  # fmt: skip
            else:
                rss = self.diagonals.toeplitz_rss() + (0.0 if self.upper is None else self.upper.toeplitz_rss())
                diagnostics = self.measures.results(0 if self.kind == "positional" else n, rss)
        mean, std, profile = host_arrays(self.maps.result("mean"), self.maps.result("std"),
                                         (self.diagonals if self.masked is None else self.masked).profile())
        assert mean is not None and std is not None and profile is not None
        return Summary(mean=mean, std=std, profile=profile, diagnostics=diagnostics, difference=self.difference)
