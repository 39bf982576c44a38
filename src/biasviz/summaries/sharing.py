"""A bias declared the same for every input, measured as the samples stream: each sample's rows against the first's.

A scheme's declaration (the registry's ``context_dependent = False``) lets a summary keep one sample's bias for all,
spread 0; a model that adds anything input-dependent to such a bias would then show a context dependence of 0 by
construction. So every sample's bias rows, as the model formed them, are compared with the first sample's rows of the
same block, and the largest |b_a(i, j) - b_0(i, j)| over the cells a query sees (j <= i when causal) is kept
(docs/hdf5.md, 'Summary files', the twin of :class:`biasviz.extraction.same_bias.SameBias` for full files). Cells that
hold the same value in both count 0; a NaN in a used cell counts as an infinite difference (the summary then refuses
it).

On a CPU one block's comparison reads both blocks once (:func:`identical`); where they differ, or on a GPU (where
an answer per sample would wait for the device every time), the largest difference is formed in one reused buffer
and kept on the device, read once per block (:meth:`Agreement.settle`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from biasviz.common.shapes import gpu_shaped, step_cells
from biasviz.summaries.maps import zero_above_
from biasviz.summaries.scratch import Scratch

GAP_CELLS = 1 << 22  # differences formed at a time (16 MiB of float32), whatever the block


class Agreement:
    """The running largest |b_a - b_0| over samples, blocks and used cells of one layer's bias.

    >>> a = Agreement(torch.device("cpu"))
    >>> first = torch.tensor([[[[1.0, 9.0], [2.0, 3.0]]]])  # (1, H, rows, keys): 9.0 is a cell no query sees
    >>> a.compare(first, first + torch.tensor([0.0, 5.0, 0.0, 0.0]).view(1, 1, 2, 2), row0=0); a.settle()
    0.0
    >>> a.compare(first, first + 0.25, row0=0); a.settle()
    0.25
    """

    def __init__(self, device: torch.device) -> None:
        self.peak = torch.zeros((), dtype=torch.float64, device=device)  # kept where the rows are: no sync per sample
        self.largest = 0.0  # as of the last settle()
        self._gap = Scratch()

    def compare(self, first: torch.Tensor, others: torch.Tensor, row0: int | None) -> None:
        """Each of ``others`` (S, H, rows, K) against ``first`` (1, H, rows, K): query rows ``row0 ..`` of a causal
        block, whose cells j > i are left out, or ``row0`` None where every cell is used."""
        rows, keys = first.shape[-2:]
        step = max(1, step_cells(first.device, GAP_CELLS) // max(1, first.shape[1] * keys))
        for s in range(others.shape[0]):
            other, base = others[s], first[0]  # (H, rows, K)
            if not gpu_shaped(other.device) and identical(other, base):  # one read of each: the usual answer
                continue
            for c0 in range(0, rows, step):  # the differences a few rows at a time, in one reused buffer
                c1 = min(rows, c0 + step)
                cut = keys if row0 is None else min(keys, row0 + c1)  # a causal row sees no key past itself
                a, b = other[:, c0:c1, :cut], base[:, c0:c1, :cut]
                gap = self._gap.take(a.shape, 1, torch.promote_types(a.dtype, b.dtype), a.device)[0]
                torch.sub(a, b, out=gap).abs_()
                if row0 is not None:
                    zero_above_(gap)
                torch.maximum(self.peak, gap.amax().double(), out=self.peak)  # NaN stays NaN

    def settle(self) -> float:
        """The largest difference so far (reads the device once); infinite where a used cell held NaN."""
        peak = float(self.peak)
        self.largest = math.inf if math.isnan(peak) else peak
        return self.largest


_NUMPY = (torch.float32, torch.float64, torch.float16)


def identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two CPU tensors of one shape and dtype hold equal values everywhere (NaN equals nothing).

    numpy compares a block at memory speed, several times faster than ``torch.equal`` on a CPU (measured 0.12 against
    0.6 ms for a million float32 cells in cache); dtypes numpy lacks (bfloat16) go to ``torch.equal``.

    >>> one = torch.tensor([0.0, 1.0])
    >>> identical(one, torch.tensor([-0.0, 1.0])), identical(one, torch.tensor([0.0, 2.0]))
    (True, False)
    """
    if a.dtype in _NUMPY and b.dtype == a.dtype:
        return bool(np.array_equal(a.numpy(), b.numpy()))
    return torch.equal(a, b)
