"""A layer's cells formed again, block of query rows by block of rows, over every sample: exact per-cell moments.

The forward of each sample keeps only what forms the layer's cells (:mod:`biasviz.summaries.bank`). Then,
for one block of query rows at a time, every sample's bias and weights of those rows are formed again (the
adapter's :meth:`~biasviz.adapters.again.FormsRowsAgain.rows_again`, the model's own arithmetic) and summed
into per-cell moments of the block alone (:class:`~biasviz.summaries.moments.ShiftedSums`). The block's
per-cell mean and spread over all samples then go into the running sums of
:class:`~biasviz.summaries.layer.QuantitySummary`, exactly as when every sample ran in one batch. Time is
linear in the number of samples; memory is one block's moments plus the bank, whatever the number of samples.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from biasviz.adapters.rows import RowBlock
from biasviz.common.errors import check_interrupted
from biasviz.common.shapes import gpu_shaped, step_cells
from biasviz.model.attention import query_blocks
from biasviz.summaries.attended import Attended
from biasviz.summaries.layer import CELLS_PER_STEP, QuantitySummary
from biasviz.summaries.moments import CountedSums, ShiftedSums
from biasviz.summaries.position import Positional
from biasviz.summaries.positional_blocks import PositionalJackknife
from biasviz.summaries.positional_errors import BiasByDistance
from biasviz.summaries.reducers import Reducer
from biasviz.summaries.sample_blocks import SampleBlocks
from biasviz.summaries.sample_profiles import SampleProfiles
from biasviz.summaries.scratch import Scratch

# a block's sums and temporaries on the CPU. 128 MiB since docs/position-measures.md (what it keeps per sample costs per
# call too): GPT-2-small shape, rope, T = 4096, N = 8, the summary's time past the forward with every section 14 measure
# 12.9 s at 64 MiB, 11.2 at 128, 11.5 at 256, 12.3 at 512; without them 5.3 s at 64 MiB, 5.0 at 128 (2 cores)
REPLAY_BYTES = 1 << 27
CUDA_REPLAY_BYTES = 1 << 32  # on a GPU (4 GiB): few, large kernels
# ... but at least MIN_REPLAY_ROWS query rows, up to REPLAY_CAP: forming a block's scores reads every key of its
# prefix, so a block of a few rows is a matrix-vector product bound by memory (GPT-2-small shape, T = 32768, one
# layer, N = 1: 64 MiB blocks of 2-5 rows took 196 s, of which 114 s were the q k^T products; at least 16 rows
# 68-78 s; 24 rows (680 MiB) 136 s and 32 rows 125 s, blocks past the caches and fresh pages each)
MIN_REPLAY_ROWS = 16
REPLAY_CAP = 1 << 29
# cells finished and pooled at a time: the summaries' own bound. Fewer, larger steps won over cache-sized ones
# (tiny, T = 16384, N = 2: finishing took 19.8-21.8 s in steps of 2^22 cells, 24.7-27.8 s in steps of 2^20)
CHUNK_CELLS = CELLS_PER_STEP
# bytes per (head, query, key) cell: for the weights and the scores, the shift and float32 sums and one
# temporary (their float64 folds past 16 samples); the bias, scores and weights formed for one sample;
# a bias that varies over samples keeps sums of its own
CELL_BYTES, VARYING_BIAS_BYTES = 72, 28
SAMPLE_CELL_BYTES = 40  # samples masked differently: float64 counted sums (CountedSums) and their temporaries


Former = Callable[[int, int, int, int, bool], RowBlock]  # (layer, sample, r0, r1, want_bias)


class DiffersPartWay(Exception):
    """A bias declared the same for every input differed in a layer whose comparison was read only at its end (a
    GPU's shapes: no read per block): the layer is to be formed again from its first row, the bias summarised per
    sample from the start (:meth:`QuantitySummary.restart`)."""


@dataclass
class LayerExtras:
    """What docs/positional.md adds to a layer's summary, filled while its rows are formed again."""

    positional: Positional | None  # None with one sample: P needs two texts
    profiles: dict[str, SampleProfiles] = field(default_factory=dict)  # kind -> each sample's profile (for the SE)
    # kind -> each sample's block means (the maps' SE); "positional": P's with each sample left out (its jackknife)
    blocks: dict[str, SampleBlocks] = field(default_factory=dict)
    # samples masked differently: each sample's own cells count for it (its rows bring them, RowBlock.attended)
    by_sample: bool = False
    # a bias that differs by sample: each one's sums by distance, for its delete-one P (P's profile SE)
    bias_distance: BiasByDistance | None = None
    # the statistics the table of datasets names a reducer for (the key profile, the sink share; where asked,
    # docs/position-measures.md's), fed every sample's row block as it is formed (or the block's moments over every
    # sample: LayerExtras.add_moments), and the call's one mask (where not causal) that each block then carries to them
    reducers: list[Reducer] = field(default_factory=list)
    mask: Attended | None = None

    def hold(self) -> None:
        for part in self._per_sample():
            part.hold()

    def commit(self) -> None:
        for part in self._per_sample():
            part.commit()

    def discard(self) -> None:
        for part in self._per_sample():
            part.discard()

    def _per_sample(self) -> list:
        return [*self.profiles.values(), *self.blocks.values(), *self.reducers]

    def reduce(self, block: RowBlock) -> None:
        """One sample's rows to every reducer, with the cells they attend; but where the block's per-cell moments over
        every sample will come (:meth:`add_moments`), to those that take them."""
        feed([r for r in self.reducers if self.by_sample or not r.moments], block, self.mask)

    def add_moments(self, r0: int, weights: torch.Tensor) -> None:
        """Rows ``r0 ..`` of the weights' per-cell mean and spread over every sample (2, H, rows, K) to the reducers
        that take them (samples masked alike: each sample's own cells, where they differ, came with its rows)."""
        if self.by_sample:
            return
        rows, keys = weights.shape[-2:]
        cells = None if self.mask is None else self.mask.rows(r0, r0 + rows, keys)[None]
        for reducer in self.reducers:
            if reducer.moments:
                reducer.add_moments(r0, weights, cells)


def cells_of(block: RowBlock, mask: Attended | None) -> torch.Tensor | None:
    """The cells ``block``'s rows attend: its own, else the rows of the call's one mask (``mask``; None: the call's
    rule, causal)."""
    if block.attended is not None or mask is None:
        return block.attended
    return mask.rows(block.r0, block.r1, block.keys)[None]


def feed(reducers: list[Reducer], block: RowBlock, mask: Attended | None) -> None:
    """``block`` to each of ``reducers``, with the call's one mask (``mask``) where it brings no cells of its own."""
    if not reducers:
        return
    if block.attended is None and mask is not None:  # the caller's block left as it came
        block = dataclasses.replace(block, attended=cells_of(block, mask))
    for reducer in reducers:
        reducer.add(block)


def feed_again(form: Former, layer: int, reducers: list[Reducer], *, samples: int, seq_len: int, heads: int,
               device: torch.device, mask: Attended | None, causal: bool = True) -> None:  # fmt: skip
    """Every sample's rows of ``layer`` formed again (no bias) for ``reducers`` alone: what the fused kernels, which
    summarised the layer, do not implement."""
    if not reducers:
        return
    for r0, r1 in row_blocks(seq_len, heads, device, False, causal=causal):
        for a in range(samples):
            feed(reducers, form(layer, a, r0, r1, False), mask)
            check_interrupted()


def bias_again(rows: Callable[[int, int, int], torch.Tensor], cells: Callable[[int, int, int], torch.Tensor],
               part: QuantitySummary, *, samples: int, seq_len: int, heads: int, device: torch.device,
               profiles: SampleProfiles | None = None, blocks: SampleBlocks | None = None) -> None:  # fmt: skip
    """A causal layer's bias that differs by sample, where samples attend cells of their own, summarised alone into
    ``part`` (each cell's mean and spread over the samples that attend it) and each sample's sums for its standard
    errors (``profiles``, ``blocks``): every sample's rows ``rows(a, r0, r1)`` (1, H, rows, r1) over its cells
    ``cells(a, r0, r1)`` (1, 1 or H, rows, r1) formed again block by block, as :func:`replay_layer` forms them; beside
    the fused kernels, which sum the weights and scores of the layer (:mod:`~biasviz.summaries.fused_layer`)."""
    scratch = {"bias": Scratch(), "work": Scratch()}
    for r0, r1 in row_blocks(seq_len, heads, device, True, by_sample=True):
        sums = CountedSums()
        for a in range(samples):
            values, own = rows(a, r0, r1), cells(a, r0, r1)
            sums.add(values[0], own[0])
            if profiles is not None:
                profiles.add(a, r0, values, own)
            if blocks is not None:
                blocks.add(a, r0, values, own)
            check_interrupted()
        step = max(1, step_cells(device, CHUNK_CELLS) // max(1, heads * r1))
        for c0 in range(0, r1 - r0, step):
            c1 = min(r1 - r0, c0 + step)
            values = sums.moments(c0, c1, r0 + c1, scratch["bias"])  # a causal chunk uses no key past its last row
            part.add_moments(r0 + c0, values, owned=True, scratch=scratch["work"])
        if blocks is not None:
            blocks.finish(r1)
    part.samples = samples


def row_blocks(seq_len: int, heads: int, device: torch.device, varying_bias: bool, budget: int | None = None,
               by_sample: bool = False, causal: bool = True) -> Iterator[tuple[int, int]]:  # fmt: skip
    """The query blocks (r0, r1) a layer is formed again in, each within ``budget`` bytes; ``by_sample``: each sample
    attends cells of its own. A causal block of rows takes keys up to its last row (early blocks take more rows); a
    call that sees keys after its query, every key.

    >>> list(row_blocks(4, 1, torch.device("cpu"), False, budget=72 * 6))
    [(0, 2), (2, 3), (3, 4)]
    >>> list(row_blocks(4, 1, torch.device("cpu"), False, budget=72 * 9, causal=False))
    [(0, 2), (2, 4)]
    """
    per_cell = heads * (CELL_BYTES + (VARYING_BIAS_BYTES if varying_bias else 0)
                        + (SAMPLE_CELL_BYTES if by_sample else 0))
    if budget is None:
        budget = CUDA_REPLAY_BYTES if gpu_shaped(device) else REPLAY_BYTES
        budget = max(budget, min(REPLAY_CAP, per_cell * MIN_REPLAY_ROWS * seq_len))
    if causal:
        return query_blocks(seq_len, per_cell, budget)
    rows = max(1, budget // (per_cell * seq_len))
    return ((r0, min(seq_len, r0 + rows)) for r0 in range(0, seq_len, rows))


class _Blocks:
    """The query blocks of a layer, sized for what it sums: smaller once a bias measured to vary keeps sums of its
    own. :attr:`done` is the first row not yet finished; a block left unfinished when :attr:`varying` turns is
    given again, in blocks of the new size (each block of the smaller size cut to start there: it fits too)."""

    def __init__(self, seq_len: int, heads: int, device: torch.device, varying: bool, budget: int | None,
                 by_sample: bool = False, causal: bool = True) -> None:  # fmt: skip
        self.seq_len, self.heads, self.device, self.budget = seq_len, heads, device, budget
        self.varying, self.done, self.by_sample, self.causal = varying, 0, by_sample, causal

    def __iter__(self) -> Iterator[tuple[int, int]]:
        while self.done < self.seq_len:
            varying = self.varying
            for r0, r1 in row_blocks(self.seq_len, self.heads, self.device, varying, self.budget, self.by_sample,
                                     self.causal):  # fmt: skip
                if r1 <= self.done:
                    continue
                yield max(r0, self.done), r1
                if self.varying != varying:
                    break


def replay_layer(form: Former, layer: int, parts: dict[str, QuantitySummary], extras: LayerExtras, *,
                 samples: int, seq_len: int, heads: int, device: torch.device, adds_bias: bool,
                 tick: Callable[[int], None] = lambda n: None, budget: int | None = None,
                 formula: bool = False, causal: bool = True) -> None:  # fmt: skip
    """Feed ``parts`` (``weights``, ``scores``, ``bias``) and ``extras`` of ``layer`` with every block of query rows
    over ``samples``; ``form(layer, sample, r0, r1, want_bias)`` forms one sample's rows, against keys up to r1 where
    the call is ``causal``, else every key.

    A bias part still ``shared`` (declared the same for every input) is measured: every sample's rows, as
    formed, against the first sample's (its :attr:`~QuantitySummary.agreement`). While all agree the first's stand
    for all, spread 0 (``formula``: the part is fed nothing, the caller summarises the scheme's f(d) instead); the
    block where one first differs is formed again with the bias summed per sample, and so is every block after it
    (with ``formula``, the first sample's rows of the blocks before are formed again and fed first).

    On a GPU the comparison is read once, at the end of the layer, not once per block (each read waits for the
    device): a layer whose bias turns out to differ raises :class:`DiffersPartWay`, and its caller forms it again
    with the bias summarised per sample from the first row. A declaration is rarely wrong, so that is the cheap way.
    """
    bias = parts.get("bias")
    if extras.by_sample and bias is not None:  # each sample's own cells, its own values: summed per sample and no
        bias.stop_comparing()  # longer compared, as when streamed (QuantitySummary.by_sample)
    agreement = None if bias is None else bias.agreement
    blocks = _Blocks(seq_len, heads, device, bias is not None and not bias.shared, budget, extras.by_sample,
                     causal)  # fmt: skip
    # each kind's finished chunk, and the summaries' temporaries: reused from block to block, given back with the layer
    scratch = {kind: Scratch() for kind in ("weights", "scores", "bias", "work")}
    jackknife = extras.blocks.get("positional")  # P's: fed the samples' scores, bias and operands
    per_block = not gpu_shaped(device)  # the comparison read after every block (a CPU), or at the layer's end
    assert jackknife is None or isinstance(jackknife, PositionalJackknife)
    for r0, r1 in blocks:
        varying = blocks.varying
        sums = {kind: CountedSums() if extras.by_sample else ShiftedSums() for kind in ("weights", "scores")}
        if varying:
            sums["bias"] = CountedSums() if extras.by_sample else ShiftedSums()
        first = None  # the first sample's bias rows (1, H, rows, r1)
        # a bias compared and read here may differ: the block formed again, so the per-sample sums wait; else they go
        # in at once (no buffer, no second addition)
        settles = per_block and agreement is not None and not varying
        if settles:
            extras.hold()
        for a in range(samples):
            got = form(layer, a, r0, r1, adds_bias and (varying or agreement is not None or a == 0))
            if got.bias is not None:  # compared first, while the rows just formed are still in the cache
                if a == 0:
                    first = got.bias
                elif agreement is not None:
                    agreement.compare(first, got.bias, r0)
            if got.attended is not None:  # this sample's own cells (docs/hdf5.md, 'Attended cells')
                for kind in ("weights", "scores"):
                    sums[kind].add(getattr(got, kind)[0], got.attended[0])
            else:
                sums["weights"].add(got.weights[0])
                sums["scores"].add(got.scores[0])
            if varying and got.attended is not None:  # over this sample's own cells
                sums["bias"].add(got.bias[0], got.attended[0])
            elif varying:
                sums["bias"].add(got.bias[0])
                if extras.bias_distance is not None:
                    extras.bias_distance.add(a, r0, got.bias)
            cells = cells_of(got, extras.mask)
            extras.reduce(got)
            pooled = {}  # each kind's block sums, where formed: P's jackknife takes them up
            for kind, values in (("weights", got.weights), ("scores", got.scores), ("bias", got.bias)):
                if values is not None and (kind != "bias" or varying):
                    if kind in extras.profiles:
                        extras.profiles[kind].add(a, r0, values, cells)
                    if kind in extras.blocks:
                        pooled[kind] = extras.blocks[kind].add(a, r0, values, got.attended)
            if jackknife is not None:
                jackknife.add_sample(a, r0, got.scores, got.bias if varying else None, pooled)
            tick(1)
            check_interrupted()
        if settles and agreement is not None and agreement.settle() > 0.0:  # the first difference
            assert bias is not None
            if formula:  # the part took nothing yet: the rows before, the same in every sample, from the first's
                _first_rows(form, layer, bias, blocks, scratch["work"])
                formula = False
            bias.unshare()
            blocks.varying = True
            extras.discard()
            continue
        fed = parts if varying or not formula else {k: p for k, p in parts.items() if k != "bias"}
        first_bias = None if varying or first is None else first[0].float()
        _finish(fed, extras, sums, first_bias, r0, r1, heads, scratch, device, None if causal else seq_len)
        if settles:
            extras.commit()
        for per_sample in extras.blocks.values():
            per_sample.finish(r1)  # every sample's rows up to r1 have come
        blocks.done = r1
        del sums, first
    if agreement is not None and agreement.settle() > 0.0 and not per_block and not blocks.varying:
        raise DiffersPartWay(layer)
    for part in parts.values():
        part.samples = samples


def _first_rows(form: Former, layer: int, bias: QuantitySummary, blocks: _Blocks, scratch: Scratch) -> None:
    """The first sample's bias rows of the blocks finished so far, formed again, into ``bias`` (spread 0)."""
    for r0, r1 in row_blocks(blocks.seq_len, blocks.heads, blocks.device, False, blocks.budget, causal=blocks.causal):
        if r0 >= blocks.done:
            return
        got = form(layer, 0, r0, r1, True)
        assert got.bias is not None
        bias.add_moments(r0, got.bias.float(), scratch=scratch)


def _finish(parts: dict[str, QuantitySummary], extras: LayerExtras, sums: dict[str, ShiftedSums],
            first_bias: torch.Tensor | None, r0: int, r1: int, heads: int,
            scratch: dict[str, Scratch], device: torch.device, every_key: int | None = None) -> None:  # fmt: skip
    """The block's per-cell mean and spread into every running sum, in steps of at most ``CHUNK_CELLS`` cells
    on a CPU (which bounds the temporaries; a GPU's are larger: :func:`~biasviz.common.shapes.step_cells`). The
    positional logits read a step's cells as they are; the summaries then take them over and change them in place.
    ``every_key``: T, where the call sees keys after its query and its rows were formed against every key (None:
    causal, keys up to r1)."""
    step = max(1, step_cells(device, CHUNK_CELLS) // max(1, heads * (every_key or r1)))
    for c0 in range(0, r1 - r0, step):
        c1 = min(r1 - r0, c0 + step)
        keys = every_key or r0 + c1  # a causal chunk uses no key past its last row
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
        extras.add_moments(r0 + c0, got["weights"])  # (the weights' summary left them as they were)
