"""Each sample's own attended cells of a call whose rows are formed again, where samples are masked differently.

Padding and packed documents give every sample a mask of its own (docs/hdf5.md, 'Attended cells'). The adapter keeps
each sample's mask in the bank beside its q and k, eight cells a byte; here they are read once, a block of rows at a
time, into what the layer's summaries count over: the cells some sample attends (the maps, profiles and diagnostics
average those, each once), the queries that see each key (the key profile) and each sample's queries that see key 0 (its
sink share). Each block of rows formed again then brings its sample's own cells.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from biasviz.adapters.again import MASK_DIGEST, SAMPLE_CELLS
from biasviz.common.errors import BiasvizError
from biasviz.summaries.attended import block_sums

ROWS_PER_READ = 1024  # rows of a sample's mask unpacked at a time (1024 x T bools)

# what a layer whose samples are masked differently leaves out, and why (its layer attribute ``note``)
BY_SAMPLE_NOTE = ("samples masked differently (padding or packed documents): each sample's own cells count for it; "
                  "the positional logits P and what derives from them (P by rotary pair, their standard errors) pair "
                  "the cells of different samples as one grid and are not stored")  # fmt: skip


@dataclass
class SampleCells:
    """What a layer's summaries count where each sample attends cells of its own."""

    union: torch.Tensor  # (1 or H, T, T) bool: the cells some sample attends (H: heads attend cells of their own)
    key_queries: torch.Tensor  # (1 or H, T) float64: the queries that see each key, averaged over samples
    seeing: torch.Tensor  # (N, 1 or H) float64: each sample's queries that see key 0
    samples: torch.Tensor | None = None  # (1 or H, nb, nb) float64: per block, Σ over samples of the cells each attends

    @classmethod
    def read(cls, bank: Any, layer: int, samples: int, seq_len: int, device: torch.device,
             block: int = 1) -> SampleCells | None:  # fmt: skip
        """From ``bank``'s cells of ``layer``; None where the layer's samples share one mask (none kept). ``block``:
        the maps' blocks, over which the samples attending each cell are counted."""
        if not bank.holds(layer, SAMPLE_CELLS):
            return None
        heads = bank.cell_heads(layer, SAMPLE_CELLS)
        union = torch.zeros(heads, seq_len, seq_len, dtype=torch.bool, device=device)
        key_queries = torch.zeros(heads, seq_len, dtype=torch.float64, device=device)
        seeing = torch.zeros(samples, heads, dtype=torch.float64, device=device)
        nb = -(-seq_len // block)
        counted = torch.zeros(heads, nb, nb, dtype=torch.float64, device=device)
        for a in range(samples):
            for r0 in range(0, seq_len, ROWS_PER_READ):
                r1 = min(seq_len, r0 + ROWS_PER_READ)
                cells = bank.get_cells(layer, SAMPLE_CELLS, a, r0, r1, seq_len).to(device)  # (1 or H, rows, T)
                union[:, r0:r1] |= cells
                key_queries += cells.sum(1, dtype=torch.float64)
                seeing[a] += cells[..., 0].sum(-1, dtype=torch.float64)
                block_sums(cells, block, r0, counted)
        return cls(union, key_queries / samples, seeing, counted)


def check_one_mask(bank: Any, layers: list[int]) -> None:
    """torchrun's processes each measured one mask (and one bias) for their own samples; joined, every sample's must be
    the same (a layer formed again takes one), or the run is refused rather than summarised with process 0's."""
    for layer in layers:
        if not bank.holds(layer, MASK_DIGEST):
            continue
        first = bank.get(layer, MASK_DIGEST, 0, 0, 1).clone()
        for a in range(1, bank.samples):
            if not torch.equal(bank.get(layer, MASK_DIGEST, a, 0, 1), first):
                raise BiasvizError(f"attention call {layer} masked other cells, or added another bias, for sample {a} "
                                   "than for the first (padding, packed documents, a bias that differs by process): "
                                   "under torchrun a summary takes one mask and one bias for every sample; run it in "
                                   "one process")  # fmt: skip
