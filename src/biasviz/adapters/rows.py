"""The one form in which what a model computed reaches the statistics: a :class:`RowBlock`.

Whether the model forms its rows as it runs (hooks streaming blocks of query rows), or a summary forms them again from
what the forward kept (a sample's q and k, :meth:`~biasviz.adapters.again.FormsRowsAgain.rows_again`), every statistic
sees the same thing: one layer, some samples, query rows r0 .. r1 - 1 against keys 0 .. K - 1, with the cells the call
attended to. A reducer (:mod:`biasviz.summaries.reducers`) takes them in any order and never asks where they came from.

Shapes (S samples of the block, H heads, rows = r1 - r0, K keys; K = r1 in a causal call, T where every key is seen):

================  =========================================  =================================================
``weights``       (S, H, rows, K)                            after the softmax; 0 where the query does not look
``scores``        (S, H, rows, K) or None                    the softmax's input; NaN where the call masked
``bias``          (1 or S, H, rows, K) or None               the additive part; one sample's for all where shared
``attended``      (1 or S, 1 or H, rows, K) bool, or None    the cells the call attended; None: exactly causal
                                                             (or, in a call that sees every key, every cell)
``q``, ``k``      (S, H, T, hd) or None                      the call's operands, k multiplied by ``scale``
``marked``        (1 or S, H, rows, K) or None               a whole call's scores or bias, NaN where it masked
================  =========================================  =================================================

A whole call sent as the model formed it (``marked`` set) holds its weights as they are, even where the call masked a
query's every key (eager code's uniform row); the summaries' :class:`~biasviz.extraction.call_masks.CallMasks` reads its
cells from ``marked`` and zeroes those weights, as it does for every statistic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class RowBlock:
    """Query rows ``r0 ..`` of ``layer`` for samples ``first .. first + S - 1``, as the model formed them."""

    layer: int
    first: int  # the block's first sample (its index among every sample of the run)
    r0: int  # its first query row
    weights: torch.Tensor
    scores: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    attended: torch.Tensor | None = None  # (1 or S, 1 or H, rows, K) bool: the cells its rows attend (None: the rule)
    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    scale: float | None = None  # c in s = c·q·kᵀ + b, where q and k came
    # a streamed call's whole mask where every sample so far has the same (a biasviz.summaries.attended.Attended, a
    # later stage than this one: its counts made once for every summary of the layer), and whether its samples are
    # masked differently (from this block's samples on, its cells are each sample's own): what a statistic that is not
    # counted per sample needs before the block's rows
    mask: Any = None
    by_sample: bool = False
    # the call's scores (or bias) as formed where the block is a whole call's matrix sent as it is: NaN exactly where
    # the call masked, so its cells are read from it where a summary needs them (extraction.call_masks), not made for a
    # full file, which keeps the weights as the model formed them
    marked: torch.Tensor | None = None
    length: int | None = None  # T: how many query rows the call has in all (None: this block holds every one)

    @property
    def samples(self) -> int:
        """S: how many samples the block's weights hold."""
        return int(self.weights.shape[0])

    @property
    def r1(self) -> int:
        """One past the block's last query row."""
        return self.r0 + int(self.weights.shape[-2])

    @property
    def keys(self) -> int:
        """K: the keys every row of the block is given (r1 in a causal call, T in one that sees every key)."""
        return int(self.weights.shape[-1])

    def of(self, kind: str) -> torch.Tensor | None:
        """The block's ``kind``: 'weights', 'scores' or 'bias' (a summary keyed by kind reads its own)."""
        return {"weights": self.weights, "scores": self.scores, "bias": self.bias}[kind]

    def cells(self, causal: bool) -> torch.Tensor:
        """(1 or S, 1 or H, rows, K) bool: the attended cells, the causal triangle or every cell where the call has
        no mask of its own.

        >>> block = RowBlock(layer=0, first=0, r0=2, weights=torch.zeros(1, 1, 2, 4))  # rows 2, 3 of a causal call
        >>> block.r1, block.keys, block.cells(causal=True)[0, 0].int().tolist()
        (4, 4, [[1, 1, 1, 0], [1, 1, 1, 1]])
        """
        if self.attended is not None:
            return self.attended
        rows, keys = self.weights.shape[-2:]
        return plain_cells(self.r0, rows, keys, causal, self.weights.device)


def plain_cells(r0: int, rows: int, keys: int, causal: bool, device: torch.device) -> torch.Tensor:
    """(1, 1, rows, K) bool: the cells of rows ``r0 ..`` that a call with no mask of its own attends, the causal
    triangle (``causal``) or every cell."""
    if not causal:
        return torch.ones(1, 1, rows, keys, dtype=torch.bool, device=device)
    i = torch.arange(r0, r0 + rows, device=device)[:, None]
    return (torch.arange(keys, device=device)[None, :] <= i)[None, None]
