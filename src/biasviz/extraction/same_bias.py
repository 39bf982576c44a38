"""Whether a bias declared the same for every input is, measured while a full file is written (docs/hdf5.md: measured,
not assumed): each sample's bias against the first's, its largest difference the root attribute ``bias_max_difference``.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch


class SameBias:
    """Measures whether a bias declared the same for every input is: each sample's against the first's.

    :attr:`largest` is the largest |b_a(i, j) - b_0(i, j)| over samples, layers and cells (those a query sees;
    0 when every sample's bias equals the first's bit for bit). One pass over what was captured, on its device,
    through a small reused buffer (:func:`largest_gap`); the first sample's bias is kept (one (H, T, T) matrix
    per layer, as a batch of one holds) only while a later batch is still to be compared with it.
    """

    def __init__(self) -> None:
        self.first: dict[int, torch.Tensor] = {}
        self.largest = 0.0

    def differs(self, bias: Mapping[int, torch.Tensor], keep: bool = True) -> bool:
        """Take one batch's bias (layer -> (1 or B, H, T, T)); True when this batch is the first to differ.

        ``keep`` False says no later batch follows: the first batch's first sample is then compared with the
        rest of its batch in place, and not copied.
        """
        before = self.largest
        for layer, b in bias.items():
            first = self.first.get(layer)
            others = b
            if first is None:  # the first batch: its first sample against the others (itself would give 0)
                first, others = b[:1], b[1:]
                if keep:
                    self.first[layer] = first.clone()  # the captured tensor is the caller's, not ours to hold
            self.largest = max(self.largest, largest_gap(others, first))
        return before == 0.0 < self.largest


GAP_ELEMENTS = 1 << 22  # cells compared at a time (16 MiB of float32): full-size differences would take B x H x T x T


def largest_gap(others: torch.Tensor, first: torch.Tensor, elements: int = GAP_ELEMENTS) -> float:
    """``float(torch.nan_to_num((others - first).abs_(), nan=0.0).amax())`` (0 for no ``others``), computed a block
    of rows at a time in one reused buffer instead of full-size temporaries: others (n, H, T, K), first (1, H, T, K).
    Cells NaN in both (those no query sees) count 0.

    The largest of the blocks' largest values is the whole's, so the result is the same bit for bit.
    """
    n, heads, rows, keys = others.shape
    if n == 0 or heads * rows * keys == 0:
        return 0.0
    step = max(1, min(rows, elements // max(keys, 1)))
    buf = torch.empty(step, keys, dtype=torch.result_type(others, first), device=others.device)
    peak = torch.zeros((), dtype=buf.dtype, device=buf.device)  # every gap is >= 0 after nan_to_num
    for s in range(n):
        for h in range(heads):
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                gap = torch.sub(others[s, h, r0:r1], first[0, h, r0:r1], out=buf[: r1 - r0]).abs_()
                torch.maximum(peak, gap.nan_to_num_(nan=0.0).amax(), out=peak)
    return float(peak)  # one device sync per batch and layer
