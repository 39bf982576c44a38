"""Statistics over samples as reducers: :class:`~biasviz.adapters.rows.RowBlock` s in, ``{dataset name: array}`` out.

A reducer is named by the rows of the table of datasets (:data:`biasviz.store.datasets.ROWS`, the column
``reducer``): the table says what the file holds, and the class it names computes it. Every way a summary forms a
layer's rows feeds the same instances: rows formed again from the bank one sample at a time, blocks streamed from a
model's hooks a batch at a time, and, beside the fused kernels, rows formed again for the reducers the kernels do not
implement. So a new statistic is its computation (a :class:`Reducer`) plus one table row; the writer, reader,
validator, joiner and views already read every row of the table.

A reducer keeps per-sample sums (a leading sample axis, float64), so that torchrun's processes join by laying their
samples one after another, a block formed again after a bias was measured to differ counts once
(:class:`~biasviz.summaries.pending.Pending`), and a standard error over samples is at hand
(:func:`~biasviz.summaries.sample_profiles.sample_stats`).
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.store.datasets import MEASURE_ROWS, ROWS, DatasetRow
from biasviz.summaries.pending import Pending


@dataclass
class KernelSums:
    """What the fused statistics kernels (:mod:`biasviz.summaries.fused_layer`) give a causal layer per sample, for
    reducers that can finish from them instead of from row blocks (:meth:`Reducer.from_kernels`)."""

    by_distance: torch.Tensor  # (N, H, T) float64: Σ_i w_a(i, i - d) over the attended cells, at distance d
    looks: torch.Tensor | None = None  # (1 or N, 1, T) float64: 1 where query i attends some key (with the measures)
    block: int = 1  # the maps' block of positions (the query blocks of the entropy)
    measures: dict[str, torch.Tensor] | None = None  # WeightMeasures' per-sample sums by name (N, H, ...)
    cells: torch.Tensor | None = None  # (1, 1 or H, T, T) the call's one mask; None: causal (or each sample's own)
    own_cells: Sequence[torch.Tensor] | None = None  # samples masked differently: [a] -> sample a's (T, T)
    # what the host's finish (biasviz.summaries.kernels.finish) made of the kernels' sums, by dataset name
    finished: dict[str, torch.Tensor] = field(default_factory=dict)


class Reducer(Pending):
    """One layer's statistic over samples. Subclasses set :attr:`rows` (the dataset names :meth:`result` gives) and
    implement :meth:`add` and :meth:`result`, keeping what they sum in :attr:`sums` (N, ...) float64 and adding to it
    with :meth:`Pending._put`, so that held additions wait (a sum over samples that is not kept per sample, as the key
    profile's, says how processes join it: :meth:`state`, :meth:`join`)."""

    rows: ClassVar[tuple[str, ...]] = ()
    # a statistic of each cell's mean and second moment over samples alone: where a block of rows is formed for every
    # sample at once, it takes their per-cell moments (:meth:`add_moments`, N times fewer operations) in place of each
    # sample's rows
    moments: ClassVar[bool] = False

    def __init__(self, *, samples: int, heads: int, seq_len: int, block: int, causal: bool, device: torch.device,
                 total: int | None = None) -> None:  # fmt: skip
        """``samples``: those this process adds; ``total``: over every process (torchrun), default ``samples``."""
        self.samples, self.heads, self.seq_len, self.block = samples, heads, seq_len, block
        self.causal, self.device = causal, device
        self.total = samples if total is None else total
        self.sums: dict[str, torch.Tensor] = {}

    def zeros(self, name: str, *shape: int) -> torch.Tensor:
        """A per-sample sum (N, *shape) float64 on the device, kept under ``name``."""
        self.sums[name] = torch.zeros(self.samples, *shape, dtype=torch.float64, device=self.device)
        return self.sums[name]

    def add(self, block: RowBlock) -> None:
        """Take one block: every sample's rows come exactly once, in any order."""
        raise NotImplementedError

    def add_moments(self, r0: int, values: torch.Tensor, cells: torch.Tensor | None) -> None:
        """(:attr:`moments`) rows ``r0 ..`` of each cell's mean and spread over every sample, (2, H, rows, K), 0 where
        a query does not see a key, over ``cells`` (1, 1 or H, rows, K; None: the call's rule)."""
        raise NotImplementedError

    def result(self) -> dict[str, np.ndarray]:
        """The arrays the file stores, by dataset name (a name of :attr:`rows`, or its standard error's)."""
        raise NotImplementedError

    def widen(self) -> None:
        """The call, taken as causal so far, turned out to attend keys after a query: from here on every block brings
        each sample's own cells, and the call's rule is every key. What the samples before added stays: their cells
        were the causal triangle (or the one mask their blocks brought)."""
        self.causal = False

    @classmethod
    def from_kernels(cls, sums: KernelSums) -> dict[str, np.ndarray] | None:
        """The rows from the fused kernels' per-sample sums, where those hold what this statistic needs (the kernels'
        implementation of it); None where they do not: the layer's rows are then formed again for it. By default, the
        rows the host's finish made itself (:attr:`KernelSums.finished`: the key profile, the sink shares)."""
        got = {name: sums.finished[name].cpu().numpy() for name in cls.rows if name in sums.finished}
        return got or None

    def state(self) -> dict[str, torch.Tensor]:
        """This process's per-sample sums, on the CPU (torchrun: joined on process 0 by :meth:`join`)."""
        return {name: t.cpu() for name, t in self.sums.items()}

    def join(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Every process's :meth:`state` in rank order (the order of the samples): their samples one after another."""
        self.sums = {name: torch.cat([s[name] for s in states]).to(self.device) for name in self.sums}
        self.samples = len(next(iter(self.sums.values()))) if self.sums else self.samples


def reducer_classes(rows: dict[str, DatasetRow] | None = None) -> list[type[Reducer]]:
    """The reducers the table names (each once, in the table's order), imported only now."""
    seen: dict[str, type[Reducer]] = {}
    for row in (ROWS if rows is None else rows).values():
        if row.reducer and row.reducer not in seen:
            module, _, name = row.reducer.partition(":")
            seen[row.reducer] = getattr(importlib.import_module(module), name)
    return list(seen.values())


def measured(cls: type[Reducer]) -> bool:
    """Whether ``cls`` gives docs/position-measures.md's rows (made where measures are asked), not docs/positional.md's
    (made with every summary)."""
    return any(name in MEASURE_ROWS for name in cls.rows)


def build(*, samples: int, heads: int, seq_len: int, block: int, causal: bool, device: torch.device,
          held: Collection[str] = (), measures: bool = True, total: int | None = None) -> list[Reducer]:  # fmt: skip
    """One instance of every reducer the table names, for one layer, but those whose rows are all in ``held``
    (already computed: the fused kernels' own), and without ``measures`` those of docs/position-measures.md.
    ``total``: the samples over every process, where this one adds ``samples`` of them."""
    return [cls(samples=samples, heads=heads, seq_len=seq_len, block=block, causal=causal, device=device, total=total)
            for cls in reducer_classes() if (measures or not measured(cls)) and not set(cls.rows) <= set(held)]


def results(reducers: list[Reducer]) -> dict[str, np.ndarray]:
    """Every reducer's arrays, by dataset name."""
    out: dict[str, np.ndarray] = {}
    for reducer in reducers:
        out.update(reducer.result())
    return out


def kernel_results(sums: KernelSums, measures: bool) -> dict[str, np.ndarray]:
    """The rows the kernels implement (:meth:`Reducer.from_kernels`) from their sums: those of docs/position-measures.md
    (``measures``), or docs/positional.md's (the key profile, the sink share)."""
    out: dict[str, np.ndarray] = {}
    for cls in reducer_classes():
        if measured(cls) == measures:
            out.update(cls.from_kernels(sums) or {})
    return out


def split(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A layer's reduced arrays -> (docs/positional.md's rows, written with every summary; docs/position-measures.md's
    rows and what they carry, written where measures are asked)."""
    positional = {name: a for name, a in arrays.items() if name in ROWS and name not in MEASURE_ROWS}
    return positional, {name: a for name, a in arrays.items() if name not in positional}
