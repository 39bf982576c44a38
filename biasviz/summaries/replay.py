"""A layer's cells formed again, block of query rows by block of rows, over every sample: exact per-cell moments.

The forward of each sample keeps only what forms the layer's cells (:mod:`biasviz.summaries.bank`). Then,
for one block of query rows at a time, every sample's bias and weights of those rows are formed again (the
adapter's :meth:`~biasviz.adapters.base.ModelAdapter.rows_again`, the model's own arithmetic) and summed
into per-cell moments of the block alone (:class:`~biasviz.summaries.moments.ShiftedSums`). The block's
per-cell mean and spread over all samples then go into the running sums of
:class:`~biasviz.summaries.layer.QuantitySummary`, exactly as when every sample ran in one batch. Time is
linear in the number of samples; memory is one block's moments plus the bank, whatever the number of samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from biasviz.adapters.base import Formed
from biasviz.common.errors import check_interrupted
from biasviz.model.attention import query_blocks
from biasviz.summaries.layer import QuantitySummary
from biasviz.summaries.moments import ShiftedSums
from biasviz.summaries.position import KeyProfile, Positional
from biasviz.summaries.scratch import Scratch

REPLAY_BYTES = 1 << 26  # a block's sums and temporaries on the CPU (64 MiB: fastest of 16-256 MiB on 2 cores)
CUDA_REPLAY_BYTES = 1 << 32  # on a GPU (4 GiB): few, large kernels
CHUNK_CELLS = 1 << 20  # cells finished and pooled at a time (4 MiB of float32: in cache)
# bytes per (head, query, key) cell: for the weights and the scores, the shift and float32 sums and one
# temporary (their float64 folds past 16 samples); the bias, scores and weights formed for one sample;
# a bias that varies over samples keeps sums of its own
CELL_BYTES, VARYING_BIAS_BYTES = 72, 28


Former = Callable[[int, int, int, int, bool], Formed]  # (layer, sample, r0, r1, want_bias)


@dataclass
class LayerExtras:
    """What SPEC section 12 adds to a layer's summary, filled while its rows are formed again."""

    positional: Positional | None  # None with one sample: P needs two texts
    keys: KeyProfile
    sinks: torch.Tensor  # (N, H) float64: Σ_i w_a(i, 0), per sample


def row_blocks(seq_len: int, heads: int, device: torch.device, varying_bias: bool,
               budget: int | None = None) -> Iterator[tuple[int, int]]:  # fmt: skip
    """The causal query blocks (r0, r1) a layer is formed again in, each within ``budget`` bytes.

    >>> list(row_blocks(4, 1, torch.device("cpu"), False, budget=72 * 6))
    [(0, 2), (2, 3), (3, 4)]
    """
    if budget is None:
        budget = CUDA_REPLAY_BYTES if device.type == "cuda" else REPLAY_BYTES
    per_cell = heads * (CELL_BYTES + (VARYING_BIAS_BYTES if varying_bias else 0))
    return query_blocks(seq_len, per_cell, budget)


def replay_layer(form: Former, layer: int, parts: dict[str, QuantitySummary], extras: LayerExtras, *,
                 samples: int, seq_len: int, heads: int, device: torch.device, adds_bias: bool,
                 tick: Callable[[int], None] = lambda n: None, budget: int | None = None) -> None:  # fmt: skip
    """Feed ``parts`` (``weights``, ``scores``, and ``bias`` unless it is summarised otherwise) and ``extras`` of
    ``layer`` with every block of query rows over ``samples``; ``form(layer, sample, r0, r1, want_bias)`` forms
    one sample's rows. A bias part in mode ``shared`` takes the first sample's values, spread 0."""
    bias = parts.get("bias")
    varying = bias is not None and bias.mode != "shared"
    # each kind's finished chunk, and the summaries' temporaries: reused from block to block, given back with the layer
    scratch = {kind: Scratch() for kind in ("weights", "scores", "bias", "work")}
    for r0, r1 in row_blocks(seq_len, heads, device, varying, budget):
        sums = {"weights": ShiftedSums(), "scores": ShiftedSums()}
        if varying:
            sums["bias"] = ShiftedSums()
        first_bias = None
        for a in range(samples):
            got = form(layer, a, r0, r1, adds_bias and (varying or a == 0))
            sums["weights"].add(got.weights[0])
            sums["scores"].add(got.scores[0])
            if varying:
                sums["bias"].add(got.bias[0])
            elif a == 0 and got.bias is not None:  # the same for every sample: the first stands for all
                first_bias = got.bias[0].float()
            extras.sinks[a] += got.weights[0, :, :, 0].sum(-1, dtype=torch.float64)
            tick(1)
            check_interrupted()
        _finish(parts, extras, sums, first_bias, r0, r1, heads, scratch)
        del sums, first_bias
    for part in parts.values():
        part.samples = samples


def _finish(parts: dict[str, QuantitySummary], extras: LayerExtras, sums: dict[str, ShiftedSums],
            first_bias: torch.Tensor | None, r0: int, r1: int, heads: int,
            scratch: dict[str, Scratch]) -> None:  # fmt: skip
    """The block's per-cell mean and spread into every running sum, a few rows at a time: finishing, pooling and
    the diagonal sums then run on data in the processor's cache, not on a block streamed from memory. The
    positional logits read a chunk as it is; the summaries then take it over and change it in place."""
    step = max(1, CHUNK_CELLS // max(1, heads * r1))
    for c0 in range(0, r1 - r0, step):
        c1 = min(r1 - r0, c0 + step)
        keys = r0 + c1  # keys past the chunk's last row: none used
        got = {kind: s.moments(c0, c1, keys, scratch[kind]) for kind, s in sums.items()}  # (2, H, rows, keys)
        if first_bias is not None:  # the same for every sample: read, not taken over
            b_mean = first_bias[:, c0:c1, :keys]
            if "bias" in parts:
                parts["bias"].add_moments(r0 + c0, b_mean[None], scratch=scratch["work"])
        else:
            b_mean = got["bias"][0] if "bias" in got else None
        if extras.positional is not None:
            extras.positional.add(r0 + c0, got["scores"][0], b_mean, scratch["work"])
        for kind, values in got.items():
            if kind in parts:
                parts[kind].add_moments(r0 + c0, values, owned=True, scratch=scratch["work"])
        extras.keys.add(got["weights"])  # last: it squares them in place (the weights' summary leaves them be)
