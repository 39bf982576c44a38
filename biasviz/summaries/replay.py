"""A layer's cells formed again, block of query rows by block of rows, over every sample: exact per-cell moments.

The forward of each sample keeps only what forms the layer's cells (:mod:`biasviz.summaries.bank`). Then,
for one block of query rows at a time, every sample's bias and weights of those rows are formed again (the
adapter's :meth:`~biasviz.adapters.base.ModelAdapter.rows_again`, the model's own arithmetic) and summed
into per-cell moments of the block alone (:class:`~biasviz.summaries.moments.ShiftedSums`).
The block's per-cell mean and spread over all
samples then go into the running sums of :class:`~biasviz.summaries.layer.QuantitySummary`, exactly as
when every sample ran in one batch. Time is linear in the number of samples; memory is one block's moments
plus the bank, whatever the number of samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from biasviz.common.errors import check_interrupted
from biasviz.model.attention import query_blocks
from biasviz.summaries.layer import QuantitySummary
from biasviz.summaries.moments import ShiftedSums

REPLAY_BYTES = 1 << 26  # a block's sums and temporaries on the CPU (64 MiB: fastest of 16-256 MiB on 2 cores)
CUDA_REPLAY_BYTES = 1 << 32  # on a GPU (4 GiB): few, large kernels
CHUNK_CELLS = 1 << 20  # cells finished and pooled at a time (4 MiB of float32: in cache)
# bytes per (head, query, key) cell: the shift and float32 sums, their float64 folds, one temporary, the
# scores and the bias (float32); a bias that varies over samples keeps sums of its own
CELL_BYTES, VARYING_BIAS_BYTES = 40, 32

Former = Callable[[int, int, int, int, bool], tuple[torch.Tensor | None, torch.Tensor]]  # rows_again(layer, ...)


def row_blocks(seq_len: int, heads: int, device: torch.device, varying_bias: bool,
               budget: int | None = None) -> Iterator[tuple[int, int]]:  # fmt: skip
    """The causal query blocks (r0, r1) a layer is formed again in, each within ``budget`` bytes.

    >>> list(row_blocks(4, 1, torch.device("cpu"), False, budget=40 * 6))
    [(0, 2), (2, 3), (3, 4)]
    """
    if budget is None:
        budget = CUDA_REPLAY_BYTES if device.type == "cuda" else REPLAY_BYTES
    per_cell = heads * (CELL_BYTES + (VARYING_BIAS_BYTES if varying_bias else 0))
    return query_blocks(seq_len, per_cell, budget)


def replay_layer(form: Former, layer: int, parts: dict[str, QuantitySummary], *, samples: int, seq_len: int,
                 heads: int, device: torch.device, tick: Callable[[int], None] = lambda n: None,
                 budget: int | None = None) -> None:  # fmt: skip
    """Feed ``parts`` (``weights``, and ``bias`` unless it is summarised otherwise) of ``layer`` with the per-cell
    mean and spread over ``samples`` of every block of query rows; ``form(layer, sample, r0, r1, want_bias)``
    forms one sample's rows. A bias part in mode ``shared`` takes the first sample's values, spread 0."""
    bias = parts.get("bias")
    varying = bias is not None and bias.mode != "shared"
    for r0, r1 in row_blocks(seq_len, heads, device, varying, budget):
        weights_m = ShiftedSums()
        bias_m = ShiftedSums() if varying else None
        for a in range(samples):
            b, w = form(layer, a, r0, r1, bias is not None and (varying or a == 0))
            weights_m.add(w[0])
            if bias_m is not None:
                bias_m.add(b[0])
            elif b is not None and bias is not None:  # shared: the first sample stands for all
                bias.add_moments(r0, b[0].float(), None)
            tick(1)
            check_interrupted()
        for kind, sums in (("weights", weights_m), ("bias", bias_m)):
            if sums is not None:
                _summarised(parts[kind], sums, r0, r1, heads)
        del weights_m, bias_m
    for part in parts.values():
        part.samples = samples


def _summarised(part: QuantitySummary, sums: ShiftedSums, r0: int, r1: int, heads: int) -> None:
    """The block's per-cell mean and spread into ``part``, a few rows at a time: each part's finishing, pooling
    and diagonal sums then run on data in the processor's cache, not on a block streamed from memory."""
    step = max(1, CHUNK_CELLS // max(1, heads * r1))
    for c0 in range(0, r1 - r0, step):
        c1 = min(r1 - r0, c0 + step)
        part.add_moments(r0 + c0, *sums.rows(c0, c1, r0 + c1))  # keys past the chunk's last row: none used
