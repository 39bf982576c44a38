"""Mean and spread over samples, per cell: within a batch directly, across batches and processes merged exactly.

Every summary is built from two per-cell numbers - the mean over samples and the (population) standard
deviation over samples - so this module is the only place where samples meet. When one batch holds every
sample (always the case once maps are coarser than cells, see :mod:`biasviz.summaries.layer`) they come from
the batch itself; otherwise :class:`CellMoments` keeps the count, mean and sum of squared deviations of every
cell and merges batch after batch (Chan, Golub and LeVeque's pairwise update), which also joins the partial
results of torchrun's processes. Identical samples give a spread of exactly 0.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from biasviz.common.shapes import gpu_shaped
from biasviz.summaries.scratch import Scratch

PARALLEL_VALUES = 1 << 18  # values from which a square root is split over torch's intra-op threads
_pools: dict[tuple[int, int], ThreadPoolExecutor] = {}  # by process (a forked child has no threads) and count


def sqrt_(x: torch.Tensor) -> torch.Tensor:
    """``x.sqrt_()``, through numpy's kernel on the CPU: torch's CPU square root takes a slow path on zeros and
    subnormal numbers (2.4 and 15 ns a value against numpy's 0.35 and 0.8, one thread; BENCHMARKS.md section 9)
    and is not correctly rounded there, and a spread over samples is mostly such numbers: every cell a query
    cannot see, or whose weight underflows. Large arrays are split along their first axis over torch's threads
    (numpy lets go of the interpreter's lock while it works).

    >>> sqrt_(torch.tensor([0.0, 4.0, 1e-40])).tolist()[:2]
    [0.0, 2.0]
    """
    if gpu_shaped(x.device) or x.requires_grad or x.dtype not in (torch.float32, torch.float64) or x.is_neg():
        return x.sqrt_()
    values = x.numpy()  # shares x's memory, whatever its strides
    threads = torch.get_num_threads()
    if threads < 2 or values.size < PARALLEL_VALUES or values.ndim == 0 or len(values) < 2:
        np.sqrt(values, out=values)
        return x
    key = (os.getpid(), threads)
    pool = _pools.get(key) or _pools.setdefault(key, ThreadPoolExecutor(threads, "biasviz-sqrt"))
    parts = np.array_split(values, min(threads, len(values)))  # views
    for _ in pool.map(lambda part: np.sqrt(part, out=part), parts):
        pass
    return x


@dataclass
class Moments:
    """Count ``n``, mean and sum of squared deviations ``m2`` of ``n`` samples, per element (float64)."""

    n: int | torch.Tensor  # a number, or one per element (samples masked differently: each cell its own)
    mean: torch.Tensor
    m2: torch.Tensor

    @classmethod
    def of(cls, x: torch.Tensor, kept: torch.Tensor | None = None) -> Moments:
        """Moments over the leading (sample) axis of ``x``, two-pass in float64; ``kept`` (broadcast to ``x``):
        which samples count at each element (then ``n`` is per element, and an element none counts is 0).

        >>> m = Moments.of(torch.tensor([[1.0, 2.0], [3.0, 2.0]]))
        >>> m.n, m.mean.tolist(), m.m2.tolist()
        (2, [2.0, 2.0], [2.0, 0.0])
        >>> m = Moments.of(torch.tensor([[1.0, 2.0], [3.0, 9.0]]), torch.tensor([[True, True], [True, False]]))
        >>> m.n.tolist(), m.mean.tolist(), m.m2.tolist()
        ([2.0, 1.0], [2.0, 2.0], [2.0, 0.0])
        """
        x = x.double()
        if kept is None:
            mean = x.mean(dim=0)
            return cls(int(x.shape[0]), mean, ((x - mean) ** 2).sum(dim=0))
        kept = kept.expand(x.shape)
        n = kept.sum(0, dtype=torch.float64)
        mean = torch.where(kept, x, 0.0).sum(0) / n.clamp(min=1.0)
        return cls(n, mean, torch.where(kept, x - mean, 0.0).square_().sum(0))

    def merged(self, other: Moments) -> Moments:
        """The moments of both sets together (Chan, Golub and LeVeque's update; per element where ``n`` is).

        >>> a, b = Moments.of(torch.tensor([[1.0], [2.0]])), Moments.of(torch.tensor([[4.0]]))
        >>> m = a.merged(b); m.n, m.mean.item(), round(m.m2.item(), 12)
        (3, 2.333333333333333, 4.666666666667)
        """
        if isinstance(self.n, int) and self.n == 0:
            return other
        if isinstance(other.n, int) and other.n == 0:
            return self
        n = self.n + other.n
        over = n.clamp(min=1.0) if isinstance(n, torch.Tensor) else n  # an element no sample counts stays 0
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.n / over)
        m2 = self.m2 + other.m2 + delta * delta * (self.n * other.n / over)
        return Moments(n, mean, m2)

    def std(self) -> torch.Tensor:
        """Population standard deviation (ddof 0); 0 where no sample counts."""
        n = self.n.clamp(min=1.0) if isinstance(self.n, torch.Tensor) else max(self.n, 1)
        return sqrt_(torch.clamp(self.m2 / n, min=0.0))


class CellMoments:
    """Per-cell moments of one (head, query, key) quantity over batches of samples, kept at full resolution.

    Used only when the maps are exact per cell (R >= T) and the samples come in several batches (models whose
    rows cannot be formed again) or processes, or where samples are masked differently: then the result itself is
    (H, T, T), and these float64 tensors are of the same order. Once :meth:`count_cells` is called, every cell
    counts the samples that attend it (docs/hdf5.md, 'Attended cells'), not every sample.
    """

    def __init__(self, heads: int, seq_len: int, device: torch.device) -> None:
        shape = (heads, seq_len, seq_len)
        self.mean = torch.zeros(shape, dtype=torch.float64, device=device)  # (H, T, T)
        self.m2 = torch.zeros(shape, dtype=torch.float64, device=device)  # (H, T, T)
        self.samples = 0  # samples merged so far: every query row has seen every finished batch
        self.count: torch.Tensor | None = None  # (H, T, T) float32: samples attending each cell, once counted

    def count_cells(self, before: torch.Tensor | None) -> None:
        """From here on each cell has its own count of samples: those merged so far attended ``before`` (1 or H,
        T, T) bool (None: none merged yet); what they held elsewhere (NaN, -inf, 0) is gone."""
        if before is None:
            self.count = torch.zeros(self.mean.shape, dtype=torch.float32, device=self.mean.device)
            return
        kept = before.to(self.mean.device).expand(self.mean.shape)
        self.count = kept.float() * self.samples
        self.mean = torch.where(kept, self.mean, 0.0)
        self.m2 = torch.where(kept, self.m2, 0.0)

    def add(self, row0: int, block: torch.Tensor, attended: torch.Tensor | None = None) -> None:
        """Merge a block (S, H, rows, K) of ``S`` samples' query rows ``row0 ..`` against keys ``0 .. K-1``
        (the current batch; :meth:`end_batch` counts it once all its rows have come). ``attended`` (S or 1, 1 or
        H, rows, K) bool, once cells are counted: which of each sample's cells count."""
        rows, keys = block.shape[-2:]
        cells = (slice(None), slice(row0, row0 + rows), slice(None, keys))
        if self.count is not None and attended is None:
            raise ValueError("counted cells need each sample's attended cells")
        new = self._moments(cells).merged(Moments.of(block, None if self.count is None else attended))
        self.mean[cells] = new.mean
        self.m2[cells] = new.m2
        if self.count is not None:
            self.count[cells] = new.n

    def _moments(self, cells: tuple[slice, ...]) -> Moments:
        """The moments so far of ``cells``: over every sample merged, or each cell's own once counted."""
        n = self.samples if self.count is None else self.count[cells].double()
        return Moments(n, self.mean[cells], self.m2[cells])

    def end_batch(self, samples: int) -> None:
        self.samples += samples

    def rows(self, row0: int, row1: int, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and standard deviation over samples of query rows ``row0 .. row1-1``, keys ``0 .. keys-1`` (over
        each cell's own samples once counted: 0 where none)."""
        m = self._moments((slice(None), slice(row0, row1), slice(None, keys)))
        return m.mean, m.std()

    def attended(self) -> torch.Tensor:
        """(H, T, T) bool: the cells some sample attended, once counted."""
        assert self.count is not None
        return self.count > 0


class ShiftedSums:
    """Per-cell mean and spread of samples that arrive one at a time (a block of rows formed sample by sample).

    Each sample's difference from the first, d = x - x_0, is summed with d² in float32, which is as fast as
    forming the block (float64 Welford updates cost four times as much); every :attr:`FOLD` samples the
    sums move into float64, so rounding grows with ``FOLD``, not with the number of samples. Shifting by a
    sample keeps the cancellation in var = E[d²] - E[d]² bounded, and identical samples give exactly 0.
    """

    FOLD = 16

    def __init__(self) -> None:
        self.n = 0
        self.shift: torch.Tensor | None = None
        self.s1 = self.s2 = torch.empty(0)  # float32 sums since the last fold
        self.f1: torch.Tensor | None = None  # float64 sums of the folded samples
        self.f2: torch.Tensor | None = None
        self._pending = 0

    def add(self, x: torch.Tensor) -> None:
        """One sample's values (any shape, the same every time)."""
        self.n += 1
        if self.shift is None:
            self.shift = x.to(torch.float32, copy=True)
            return
        d = torch.sub(x, self.shift)
        if self._pending == 0:  # the first difference since a fold starts the sums: no zeroed buffers
            self.s1, self.s2 = d, d * d
        else:
            self.s1.add_(d)
            self.s2.addcmul_(d, d)
        self._pending += 1
        if self._pending == self.FOLD:
            self._fold()

    def _fold(self) -> None:
        if self.f1 is None or self.f2 is None:
            self.f1, self.f2 = self.s1.double(), self.s2.double()
        else:
            self.f1.add_(self.s1)
            self.f2.add_(self.s2)
        self._pending = 0  # the next difference starts new float32 sums

    def rows(self, row0: int, row1: int, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and population standard deviation of rows ``row0 .. row1 - 1`` (the second-last axis) and the
        first ``keys`` columns, float32: :meth:`moments` apart."""
        mean, spread = self.moments(row0, row1, keys)
        return mean, spread

    def moments(self, row0: int, row1: int, keys: int, scratch: Scratch | None = None) -> torch.Tensor:
        """:meth:`rows`' mean and spread stacked (2, ..., rows, keys) in one float32 tensor, new or in ``scratch``:
        a caller reads a large block in cache-sized parts and may change them in place, and the summaries take
        both in one pass.

        >>> s = ShiftedSums(); s.add(torch.tensor([[1.0, 5.0]])); s.add(torch.tensor([[3.0, 5.0]]))
        >>> s.moments(0, 1, 2).tolist()
        [[[2.0, 5.0]], [[1.0, 0.0]]]
        """
        if self.shift is None:
            raise ValueError("no sample was added")
        if self.f1 is not None and self._pending:
            self._fold()
        cells = (..., slice(row0, row1), slice(None, keys))
        shift = self.shift[cells]
        out = (scratch or Scratch()).take(shift.shape, 2, shift.dtype, shift.device)
        if self.n == 1:  # one sample: its values, no spread
            out[0], out[1] = shift, 0.0
            return out
        wide = self.f1 is not None
        s1, s2 = (self.f1, self.f2) if wide else (self.s1, self.s2)
        assert s1 is not None and s2 is not None
        # float32 sums go straight into ``out``; float64 ones are finished in float64 and rounded once at the end
        mean_d = torch.mul(s1[cells], 1.0 / self.n, out=None if wide else out[0])
        spread = torch.mul(s2[cells], 1.0 / self.n, out=None if wide else out[1])
        sqrt_(spread.addcmul_(mean_d, mean_d, value=-1.0).clamp_(min=0.0))
        mean_d.add_(shift)
        if wide:
            out[0], out[1] = mean_d, spread
        return out


class CountedSums:
    """:class:`ShiftedSums` where each sample attends cells of its own (padding, packed documents; docs/hdf5.md,
    'Attended cells'): every cell's mean and spread over the samples that attend it, by Welford's update in float64 with
    a count per cell. 0 mean and spread where no sample attends a cell. (Each sample merged as ``Moments.of(x[None],
    kept[None])`` into :meth:`Moments.merged` gives the same numbers but made a padded summary 1.4-1.5x slower: T =
    2048, 1.9-2.1 s against 1.4 s; T = 4096, 6.1 against 4.1 s, ``bench/padded_summary.py``.)"""

    def __init__(self) -> None:
        self.count: torch.Tensor | None = None
        self.mean = self.m2 = torch.empty(0, dtype=torch.float64)

    def add(self, x: torch.Tensor, kept: torch.Tensor) -> None:
        """One sample's values and the cells it attends (broadcast to ``x``)."""
        x = x.double()
        kept = kept.expand(x.shape)
        if self.count is None:
            self.count = kept.double()
            self.mean = torch.where(kept, x, 0.0)
            self.m2 = torch.zeros_like(self.mean)
            return
        self.count += kept
        delta = torch.where(kept, x - self.mean, 0.0)
        self.mean.addcdiv_(delta, self.count.clamp(min=1.0))
        self.m2 += torch.where(kept, delta * (x - self.mean), 0.0)

    def moments(self, row0: int, row1: int, keys: int, scratch: Scratch | None = None) -> torch.Tensor:
        """(2, ..., rows, keys) float32: the mean and population spread of rows ``row0 .. row1 - 1`` (the
        second-last axis), keys ``0 .. keys - 1``, as :meth:`ShiftedSums.moments` gives them.

        >>> s = CountedSums()
        >>> s.add(torch.tensor([[1.0, 5.0]]), torch.tensor([[True, True]]))
        >>> s.add(torch.tensor([[3.0, 9.0]]), torch.tensor([[True, False]]))
        >>> s.moments(0, 1, 2).tolist()
        [[[2.0, 5.0]], [[1.0, 0.0]]]
        """
        if self.count is None:
            raise ValueError("no sample was added")
        cells = (..., slice(row0, row1), slice(None, keys))
        m = Moments(self.count[cells], self.mean[cells], self.m2[cells])
        out = (scratch or Scratch()).take(m.mean.shape, 2, torch.float32, m.mean.device)
        out[0], out[1] = m.mean, m.std()
        return out
