"""One layer's bias or weights, summarised as the model forms them: maps, profile and (bias) diagnostics.

How samples meet (:mod:`biasviz.summaries.moments`) sets the mode:

- ``shared``: a context-free bias, the same for every sample: taken from the first batch, spread 0;
- ``joint``: one batch holds every sample, so each block of rows gives its per-cell mean and spread at once and
  nothing of size T² is kept (the mode whenever the maps are coarser than cells);
- ``cells``: maps exact per cell (R >= T) with samples in several batches: per-cell moments are kept (the size
  of the result) and summarised at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from biasviz.common.errors import BiasvizError
from biasviz.store.format import non_finite_error
from biasviz.summaries.diagonals import DiagonalSums
from biasviz.summaries.maps import BlockMaps, zero_above_
from biasviz.summaries.measures import BiasMeasureSums
from biasviz.summaries.moments import CellMoments, Moments
from biasviz.summaries.scratch import Scratch

MODES = ("shared", "joint", "cells")
CELLS_PER_STEP = 1 << 22  # cells (heads x rows x keys) summarised at a time: bounds the temporaries


@dataclass
class Summary:
    """What a file keeps of one quantity of one layer (SPEC section 11)."""

    mean: np.ndarray  # (H, nb, nb) float32
    std: np.ndarray  # (H, nb, nb) float32
    profile: np.ndarray  # (2, H, T) float32: mean, std by distance
    diagnostics: np.ndarray | None  # (H,) records of DIAGNOSTIC_FIELDS, bias only


class QuantitySummary:
    """Receives blocks of query rows of one quantity (``bias`` or ``weights``) of one layer."""

    def __init__(self, kind: str, layer: int, *, heads: int, seq_len: int, block: int, causal: bool, mode: str,
                 device: torch.device) -> None:  # fmt: skip
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.kind, self.layer, self.mode = kind, layer, mode
        self.heads, self.seq_len, self.causal = heads, seq_len, causal
        self.maps = BlockMaps(heads, seq_len, block, device, ("mean", "std"), causal=causal)
        self.diagonals = DiagonalSums(heads, seq_len, device)
        self.measures = BiasMeasureSums(heads, seq_len, device) if kind in ("bias", "positional") else None
        self.cells = CellMoments(heads, seq_len, device) if mode == "cells" else None
        self.samples = 0  # samples seen so far (batches ended)
        self._batch = 0  # samples in the current batch
        self._taken = False  # shared: the one bias has been summarised

    def begin_batch(self, samples: int) -> None:
        self._batch = samples

    def end_batch(self) -> None:
        self.samples += self._batch
        if self.cells is not None:
            self.cells.end_batch(self._batch)
        if self.mode == "shared" and self.samples:
            self._taken = True

    def add(self, row0: int, block: torch.Tensor) -> None:
        """A block (S or 1, H, rows, K) of query rows ``row0 ..`` against keys ``0 .. K-1``, as formed."""
        if self.mode == "shared":
            if not self._taken:
                self.add_moments(row0, block[:1])
            return
        if block.shape[0] == 1 and self._batch > 1:  # one tensor for the whole batch (a broadcast mask)
            block = block.expand(self._batch, *block.shape[1:])
        if self.mode == "cells":
            assert self.cells is not None
            self.cells.add(row0, block)
            return
        if block.shape[0] == 1:
            self.add_moments(row0, block)
            return
        step = max(1, CELLS_PER_STEP // max(1, block.shape[1] * block.shape[-1]))
        for r in range(0, block.shape[-2], step):
            m = Moments.of(block[:, :, r : r + step])
            self.add_moments(row0 + r, torch.stack([m.mean, m.std()]), owned=True)

    def add_moments(self, row0: int, values: torch.Tensor, owned: bool = False, scratch: Scratch | None = None) -> None:
        """Per-cell mean and, if ``values`` (S, H, rows, K) holds two, spread over samples of rows ``row0 ..``, into
        every running sum (one: the same for every sample). ``owned``: the caller gives ``values`` up, so that
        they are changed in place rather than copied; ``scratch``: the caller's memory for the temporaries."""
        rows, keys = values.shape[-2:]
        step = max(1, CELLS_PER_STEP // max(1, self.heads * keys))
        if rows > step:
            for r in range(0, rows, step):
                cut = row0 + r + step if self.causal else keys  # a causal row block uses no key past its last row
                self.add_moments(row0 + r, values[..., r : r + step, :cut], owned, scratch)
            return
        if self.causal and keys > row0 + rows:  # keys no query of these rows sees
            values = values[..., : row0 + rows]
        # weights are 0 wherever a query does not look; a bias holds values (or NaN) there, to be left out
        if self.causal and self.kind != "weights":
            values = zero_above_(values if owned else values.clone())
        if not self.maps.add(row0, values):
            raise non_finite_error(self.kind, self.layer)
        self.diagonals.add(row0, values, scratch)
        if self.measures is not None:
            self.measures.add(row0, values, self.causal, scratch)

    def result(self, total_samples: int | None = None) -> Summary:
        """The finished summary; ``total_samples`` (all processes') decides whether context dependence is defined."""
        if self.cells is not None:
            step = max(1, CELLS_PER_STEP // max(1, self.heads * self.seq_len))
            for r0 in range(0, self.seq_len, step):
                r1 = min(self.seq_len, r0 + step)
                mean, spread = self.cells.rows(r0, r1, r1 if self.causal else self.seq_len)
                self.add_moments(r0, torch.stack([mean, spread]), owned=True)
        if self.diagonals.count.sum() == 0:  # no row arrived
            raise BiasvizError(f"nothing was captured for the {self.kind} of layer {self.layer}")
        n = self.samples if total_samples is None else total_samples
        diagnostics = None
        if self.measures is not None:
            # P is one matrix over all samples: it has no spread of its own, so no context dependence
            diagnostics = self.measures.results(0 if self.kind == "positional" else n, self.diagonals.toeplitz_rss())
        return Summary(mean=self.maps.result("mean").cpu().numpy(), std=self.maps.result("std").cpu().numpy(),
                       profile=self.diagonals.profile().cpu().numpy(), diagnostics=diagnostics)  # fmt: skip
