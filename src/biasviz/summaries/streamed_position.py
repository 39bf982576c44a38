"""docs/positional.md for models whose rows cannot be formed again: P, the key profile and sinks as the model streams.

Models biasviz cannot replay (a bias in the call: DeBERTa's relative terms, a float mask, eager attention, torch's
MHA layers) send each sample's blocks of scores, bias and weights as they form them, with the q and k each call
received (:attr:`~biasviz.tracing.calls.AttentionCall.q`). A summary of such a model already keeps per-cell
moments of the whole (H, T, T) matrix; P needs, besides the sums Q and K, two more per-cell sums of that size:
Σ_a s_a and Σ_a b_a, since c·G = Σ_a (s_a − b_a). At the end P is formed block of rows by block of rows from them
(:class:`~biasviz.summaries.position.Positional`), as for replayed models. The weights give the key profile, each
sample's sink share and the other reducers of the table of datasets their blocks as they pass.

Under torchrun each process streams its block of samples; :meth:`StreamedPosition.state` gives its sums and
:meth:`StreamedPosition.join` adds every process's in rank order (the order of the samples) on process 0, which
then forms P as one process would.
"""

from __future__ import annotations

import dataclasses

import torch

from biasviz.adapters.rotary import RotaryLayout
from biasviz.adapters.rows import RowBlock
from biasviz.store.datasets import MIN_SE_SAMPLES, SAMPLES_PER_CELL, profile_name, se_name
from biasviz.summaries.attended import Attended, block_sums, cells_before, samples_per_cell
from biasviz.summaries.frequency import FrequencyUse
from biasviz.summaries.position import Positional, PositionSummary
from biasviz.summaries.positional_errors import StreamedJackknife
from biasviz.summaries.reducers import build, results, split
from biasviz.summaries.sample_blocks import SampleBlocks, block_errors, sample_blocks
from biasviz.summaries.sample_cells import BY_SAMPLE_NOTE
from biasviz.summaries.sample_profiles import SampleProfiles

ROWS = 256  # query rows of P formed at a time at the end
# a streamed layer some of whose samples' calls brought no q and k (P needs every sample's)
SOME_OPERANDS_NOTE = "the positional logits P are not stored: some samples' calls gave no q and k to form them from"
# a streamed layer whose additive part differs by sample: what P's block map's SE would need and is not kept
BIAS_DIFFERS_NOTE = ("the additive part differs by sample: P's block map has no standard error (its delete-one P needs "
                     "each sample's bias sums by block, past the memory kept for them)")  # fmt: skip


class StreamedPosition:
    """One layer's docs/positional.md sums over every sample streamed through it."""

    def __init__(self, layer: int, *, heads: int, seq_len: int, samples: int, block: int, causal: bool,
                 device: torch.device, positional: bool = True, local: int | None = None,
                 measures: bool = True, rotary: RotaryLayout | None = None) -> None:  # fmt: skip
        """``samples``: N, over every process; ``local``: those this process streams (default: all of them);
        ``measures``: docs/position-measures.md's measures of the weights."""
        self.layer, self.heads, self.seq_len, self.samples = layer, heads, seq_len, samples
        self.block, self.causal, self.device = block, causal, device
        self.positional = positional and samples >= 2  # P needs two texts
        self.q: torch.Tensor | None = None  # (T, H, hd) float64: Σ_a q_a
        self.k: torch.Tensor | None = None  # Σ_a c·k_a: the stream sends k multiplied by the call's scale c
        self.scores: torch.Tensor | None = None  # Σ_a s_a, from the first scores block on
        self.bias: torch.Tensor | None = None  # Σ_a b_a, from the first bias block on
        self.local = samples if local is None else local  # the samples this process streams
        self.frequency = FrequencyUse(rotary, self.local) if measures and rotary is not None else None
        self._measured = measures
        # the statistics the table of datasets names a reducer for (the key profile, the sink share; where asked,
        # docs/position-measures.md's), fed each block as it streams (this process's samples: joined in rank order
        # under torchrun)
        self.reducers = build(samples=self.local, heads=heads, seq_len=seq_len, block=block, causal=causal,
                              device=device, measures=measures, total=samples)  # fmt: skip
        self.profiles = self._profiles()
        self.blocks = self._blocks(None)
        # P's profile SE (causal calls, 3 samples or more, all in this process): each sample's q and k are kept
        whole = local is None or local == samples
        self.jackknife = (StreamedJackknife(samples=samples, heads=heads, seq_len=seq_len, device=device, block=block)
                          if self.positional and measures and causal and whole and samples >= MIN_SE_SAMPLES
                          else None)  # fmt: skip

    attended: Attended | None = None  # the call's own mask, where not causal (docs/hdf5.md, 'Attended cells')

    def attend(self, attended: Attended) -> None:
        """P and the maps' SEs over the cells of the call's own mask; before any block is added (the other statistics
        count the cells each block brings)."""
        self.attended = attended
        self.blocks = self._blocks(attended)  # its counts made once (the streamed blocks' rows of it need none)

    union: torch.Tensor | None = None  # masks that differ by sample: the cells some sample attends (1 or H, T, T)
    note: str | None = None

    def by_sample(self, first: int) -> None:
        """From sample ``first`` on, samples are masked differently (docs/hdf5.md, 'Attended cells'); those streamed
        before attended the one mask they had (:meth:`attend`), or the call's rule. The rotary frequencies (over each
        sample's own positions) and the samples per cell count each sample's own cells from here on (the reducers, the
        key profile, the sink shares and the profiles' and maps' SEs need no word: they count the cells each block
        brings); P, which pairs the cells of different samples as one grid, is left out, with :attr:`note` saying so."""
        before = None
        if first:
            before = cells_before(self.attended, self.seq_len, self.causal)
        with torch.inference_mode(False):
            self.union = torch.zeros(1, self.seq_len, self.seq_len, dtype=torch.bool, device=self.device)
            nb = -(-self.seq_len // self.block)
            self.cell_samples = torch.zeros(1, nb, nb, dtype=torch.float64, device=self.device)
            if before is not None and first:
                self.union = self.union | before.to(self.device)
                self.cell_samples = self.cell_samples + block_sums(before.to(self.device), self.block) * first
        self.positional, self.q, self.k, self.scores, self.bias = False, None, None, None, None
        if self.jackknife is not None:
            self.jackknife.bank.close()
            self.jackknife = None
        self.attended = None
        self.note = BY_SAMPLE_NOTE

    def widen(self, first: int) -> None:
        """From sample ``first`` on (> 0: some came before), the call, taken as causal so far, attends keys after a
        query: it sees every key within each sample's own cells. The samples before keep the cells they attended
        (:meth:`by_sample`: the causal triangle, or the one mask they had), and what pairs the cells of different
        samples (P) is left out, as for samples masked differently."""
        if self.union is None:
            self.by_sample(first)
        self.causal = False
        for part in [*self.reducers, *self.profiles.values(), *self.blocks.values()]:
            part.widen()

    def _count_cells(self, r0: int, cells: torch.Tensor) -> None:
        """Samples masked differently: a block's cells (B or 1, 1 or H, rows, K) of rows ``r0 ..`` into the cells some
        sample attends (:attr:`union`) and the samples that attend each block's cells (:attr:`cell_samples`)."""
        assert self.union is not None
        every = cells.expand(self._batch, *cells.shape[1:]) if cells.shape[0] == 1 else cells
        every = every.to(self.device)
        rows, keys = every.shape[-2:]
        with torch.inference_mode(False):  # called inside the model's forward: the sums outlive it
            if every.shape[1] > self.union.shape[0]:  # cells that differ by head
                self.union = self.union.expand(every.shape[1], -1, -1).clone()
                self.cell_samples = self.cell_samples.expand(every.shape[1], -1, -1).clone()
            self.union[:, r0 : r0 + rows, :keys] |= every.any(0)
            block_sums(every.sum(0, dtype=torch.float32), self.block, r0,
                       out=self.cell_samples[..., : -(-keys // self.block)])  # fmt: skip

    def _profiles(self) -> dict[str, SampleProfiles]:
        """Each sample's profile of the scores and bias, for their SE (3 samples or more, over every process)."""
        if not self._measured or self.samples < MIN_SE_SAMPLES:
            return {}
        return {kind: SampleProfiles(samples=self.local, heads=self.heads, seq_len=self.seq_len,
                                     causal=self.causal, device=self.device)
                for kind in ("scores", "bias")}  # fmt: skip (the weights' come with their measures)

    def _blocks(self, attended: Attended | None) -> dict[str, SampleBlocks]:
        """Each sample's block means of all three quantities, for the maps' SE: over the call's one mask
        (``attended``), or its rule, until samples are masked differently; then over the cells each block brings."""
        return sample_blocks(("weights", "scores", "bias") if self._measured else (), heads=self.heads,
                             seq_len=self.seq_len, block=self.block, causal=self.causal, samples=self.samples,
                             device=self.device, attended=attended)  # fmt: skip

    def operands(self, q: torch.Tensor, k: torch.Tensor) -> None:
        """A batch's q (B, H, T, hd) and c·k (B, H, T, hd, key heads repeated), as its call received them."""
        if not self.positional:
            return
        q_sum, k_sum = (t.double().sum(0).transpose(0, 1) for t in (q, k))  # (T, H, hd)
        self.q = q_sum if self.q is None else self.q + q_sum
        self.k = k_sum if self.k is None else self.k + k_sum
        seen = torch.full((), float(q.shape[0]), dtype=torch.float64, device=q_sum.device)
        self.operand_samples = seen if self.operand_samples is None else self.operand_samples + seen

    def add_block(self, block: RowBlock) -> None:
        """Every quantity of a :class:`RowBlock` of the batch under way, and the call's q and k where it brings them:
        its ``attended``, the cells its rows attend (None: causal, or every cell)."""
        if block.by_sample and self.union is None:  # samples masked differently, from this block's on
            self.by_sample(block.first)
        elif block.mask is not None and self.attended is None and self.union is None:  # the call's one mask
            self.attend(block.mask)
        wide = dataclasses.replace(block, weights=block.weights.double())  # the model's precision may be lower
        if self.union is not None and block.attended is not None:
            self._count_cells(block.r0, block.attended)
        for kind in ("bias", "weights", "scores"):
            values = block.of(kind)
            if values is not None:
                self.add(kind, block.first, block.r0, values, block.attended)
        for reducer in self.reducers:
            reducer.add(wide)
        if block.q is not None and block.k is not None and block.scale is not None:
            if block.attended is not None and (block.r0, block.r1) != (0, self.seq_len):
                raise ValueError("a block that brings the call's q and k brings every row of the call")
            self._add_operands(block.first, block.q, block.k, block.scale, block.attended)

    def _add_operands(self, first: int, q: torch.Tensor, k: torch.Tensor, scale: float,
                      cells: torch.Tensor | None = None) -> None:  # fmt: skip
        """Samples ``first ..``'s q (B, H, T, hd) and k already multiplied by the call's scale ``scale``; ``cells`` (B
        or 1, 1 or H, T, T): the cells the call attended (None: causal, or every cell)."""
        if self.frequency is not None:  # over the positions the batch's cells hold (padding left out)
            self.frequency.add(first, q, k / scale, cells)
        if self.jackknife is not None:
            self.jackknife.operands(first, q, k)
        self.operands(q, k)

    def add(self, kind: str, first: int, row0: int, block: torch.Tensor, cells: torch.Tensor | None = None) -> None:
        """Rows ``row0 ..`` of samples ``first ..`` of one kind ("scores", "bias", "weights"): (B or 1, H, rows, K),
        masked cells NaN (0 in the weights), over ``cells`` (1 or B, 1 or H, rows, K; None: causal, or every cell); a
        bias of one sample for the whole batch counts for each."""
        rows, keys = block.shape[-2:]
        every = block.expand(self._batch, *block.shape[1:]) if block.shape[0] == 1 else block
        if kind in self.profiles:  # a bias of one sample for the whole batch counts for each
            self.profiles[kind].add(first, row0, every, cells)
        if kind in self.blocks:  # the batch's rows come in order: the query blocks before row0 + rows are complete
            if first != self._first:
                self._first = first
                for b in self.blocks.values():
                    b.begin(first, self._batch)
            self.blocks[kind].add(first, row0, every, None if self.union is None else cells)
            self.blocks[kind].finish(row0 + rows)
        if kind == "weights":  # (the key profile and the sink shares are reducers: fed the block whole)
            return
        if kind == "bias" and self.jackknife is not None:
            self.jackknife.add_bias(first, row0, every, self.attended)
        if not self.positional or kind not in ("scores", "bias"):
            return
        total = block.nan_to_num(0.0).sum(0) * (1 if block.shape[0] > 1 else self._batch)
        name = "scores" if kind == "scores" else "bias"
        if getattr(self, name) is None:
            setattr(self, name, torch.zeros(self.heads, self.seq_len, self.seq_len, device=self.device))
        getattr(self, name)[:, row0 : row0 + rows, :keys] += total

    _batch = 1  # samples in the batch under way (a bias block shared by the batch counts once per sample)
    _first = -1  # its first sample, once a block of it came

    def begin_batch(self, size: int) -> None:
        self._batch = size

    # how many samples brought their q and k: P is formed from every sample's, or not at all
    operand_samples: torch.Tensor | None = None
    _SUMS = ("q", "k", "scores", "bias", "operand_samples")

    def state(self) -> dict[str, torch.Tensor | None]:
        """This process's sums, on the CPU, for :meth:`join` in process 0."""
        sums = {name: getattr(self, name) for name in self._SUMS}
        if self.frequency is not None and self.frequency.per_sample is not None:
            sums["frequency"] = self.frequency.per_sample
        sums.update({f"profile.{kind}.{name}": t for kind, p in self.profiles.items() for name, t in p.state().items()})
        sums.update({f"reducer.{i}.{name}": t for i, r in enumerate(self.reducers) for name, t in r.state().items()})
        return {name: None if t is None else t.cpu() for name, t in sums.items()}

    def join(self, states: list[dict[str, torch.Tensor | None]]) -> None:
        """Every process's :meth:`state`, in rank order (this one's among them): the sums over all samples, added in
        that order, and the samples' sink shares one after another."""
        for name in self._SUMS:
            total = None
            for part in (s[name] for s in states if s[name] is not None):
                total = part.to(self.device) if total is None else total + part.to(self.device)
            setattr(self, name, total)
        for kind, p in self.profiles.items():  # per-sample sums and counts one after another
            own = f"profile.{kind}."
            p.join([{k.removeprefix(own): v for k, v in s.items() if k.startswith(own)} for s in states])
        for i, reducer in enumerate(self.reducers):
            own = f"reducer.{i}."
            reducer.join([{k.removeprefix(own): v for k, v in s.items() if k.startswith(own)} for s in states])
        if self.frequency is not None:
            self.frequency.samples = self.samples
            self.frequency.per_sample = torch.cat([s["frequency"] for s in states]).to(self.device)

    def result(self) -> PositionSummary:
        """P's block means, distance profile and diagnostics (None with one sample), the key profile, sink shares."""
        mean = profile = diagnostics = None
        whole = self.operand_samples is not None and int(self.operand_samples) == self.samples
        if self.positional and self.q is not None and not whole:  # a sum of some samples' q and k is no P
            self.note = f"{self.note}; {SOME_OPERANDS_NOTE}" if self.note else SOME_OPERANDS_NOTE
        if self.positional and self.q is not None and self.k is not None and self.scores is not None and whole:
            p = Positional(self.q, self.k, layer=self.layer, scale=1.0, samples=self.samples,
                           seq_len=self.seq_len, block=self.block, device=self.device, causal=self.causal,
                           attended=self.attended)  # fmt: skip
            n = self.samples
            for r0 in range(0, self.seq_len, ROWS):
                r1 = min(r0 + ROWS, self.seq_len)
                keys = r1 if self.causal else self.seq_len
                scores = self.scores[:, r0:r1, :keys] / n
                bias = None if self.bias is None else self.bias[:, r0:r1, :keys] / n
                p.add(r0, scores.contiguous(), None if bias is None else bias.contiguous())
            got = p.result()
            mean, profile, diagnostics = got[0].cpu().numpy(), got[1].cpu().numpy(), got[2]
        attended = self.attended
        if attended is None and self.union is not None:  # masks that differ by sample: the cells some sample attends
            attended = Attended(self.union)
        shares = None if attended is None else attended.block_shares(self.block, self.heads).cpu().numpy()
        reduced, measured = split(results(self.reducers))
        measures = self._measure_arrays(measured)  # (first: it may add to the note)
        return PositionSummary(positional_mean=mean, positional_profile=profile, positional_diagnostics=diagnostics,
                               reduced=reduced, attended=shares,
                               measures=measures, note=self.note)  # fmt: skip

    def _measure_arrays(self, measured: dict) -> dict | None:
        """docs/position-measures.md's arrays: the weights' measures (``measured``, its reducers' rows), and the rotary
        frequencies' use where the call rotates."""
        if not self._measured:
            return None
        arrays = {**measured, **block_errors(self.blocks)}
        arrays.update({se_name(profile_name(kind)): se.float().cpu().numpy() for kind, p in self.profiles.items()
                       if p.seen and (se := p.standard_error()) is not None})  # fmt: skip
        if self.frequency is not None and self.frequency.per_sample is not None:
            arrays.update(self.frequency.result())
        if self.jackknife is not None and self.positional:
            arrays.update(self.jackknife.standard_errors(self.attended, self.block))
            if self.jackknife.mean_left_out:
                self.note = f"{self.note}; {BIAS_DIFFERS_NOTE}" if self.note else BIAS_DIFFERS_NOTE
        if self.union is not None:  # each cell's mean is over the samples that attend it: how many they are
            arrays[SAMPLES_PER_CELL] = samples_per_cell(self.cell_samples, self.union, self.block, self.heads)
        return arrays
