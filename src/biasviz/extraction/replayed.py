"""Summaries of models whose rows are formed again: every sample's forward keeps what forms them, then each layer's
rows are formed block of rows by block of rows over all samples (:mod:`biasviz.summaries.replay`).

Time is linear in the number of samples; memory one batch plus the bank (q and k of each sample, and where samples
are masked differently, each one's attended cells, eight a byte). :func:`biasviz.extraction.summary.summarise`
chooses this way for adapters that can form rows again.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from biasviz.adapters.base import ModelAdapter, RowBlock
from biasviz.common.devices import autocast_as
from biasviz.common.errors import MasksDifferBySample, check_interrupted
from biasviz.common.progress import Progress
from biasviz.common.shapes import host_arrays
from biasviz.extraction.stream_from import StreamFrom
from biasviz.store.datasets import MIN_SE_SAMPLES, SAMPLES_PER_CELL
from biasviz.summaries import QuantitySummary, Summary, kernels
from biasviz.summaries.attended import Attended, samples_per_cell
from biasviz.summaries.bank import SampleBank
from biasviz.summaries.fused_layer import CHOSEN, fused_available, fused_layer, tell, why_not
from biasviz.summaries.kernels.biases import Bias, CellBias, KeyBias, MlpBias, SampleEnds, SampleKeys, mlp_bias
from biasviz.summaries.position import Positional, PositionSummary
from biasviz.summaries.positional_blocks import PositionalJackknife
from biasviz.summaries.positional_errors import BiasByDistance
from biasviz.summaries.positional_frequency import add_pair_sum_residual, rotary_measures
from biasviz.summaries.reducers import build, results, split
from biasviz.summaries.replay import DiffersPartWay, LayerExtras, feed_again, replay_layer, row_blocks
from biasviz.summaries.sample_blocks import block_errors, sample_blocks
from biasviz.summaries.sample_cells import BY_SAMPLE_NOTE, SampleCells, check_one_mask
from biasviz.summaries.sample_profiles import per_sample_profiles, profile_errors
from biasviz.summaries.toeplitz import toeplitz_summary

# torchrun with a model whose rows are formed again: every process's bank, joined in rank order on process 0
# (None on the others, whose part ends there)
Gather = Callable[[SampleBank], SampleBank | None]
Parts = dict[tuple[str, int], QuantitySummary]


def replayed(adapter: ModelAdapter, ids: np.ndarray, layer_list: list[int], dev: torch.device, parts: Parts,
              batch: int, show: bool | None, scratch: str | Path | None, block: int,
              gather: Gather | None = None, positional: bool = True,
              formula: Mapping[int, torch.Tensor] | None = None, measures: bool = True,
              caller: Mapping[str, str] | None = None) -> dict[int, PositionSummary] | None:  # fmt: skip
    """Forward every sample keeping what forms the rows, then form each layer's rows over all samples.

    Each phase has a progress bar (a heartbeat line in a log) of its own, named "summarise (phase K of P): ...":
    the forward (samples x layers run), then forming each layer's rows (blocks of query rows x samples). One bar
    over both read 67 % when the forward was done and then ran on for minutes: the phases go at different rates,
    so a rate and a time left hold only within one.
    Returns each layer's docs/positional.md extras (positional logits, the weights' key profile, sink shares).
    ``formula``: the layers whose bias, while measured the same for every sample, is summarised from f(d), with
    their f (H, T). Layers the fused kernels cover are summarised by them (:mod:`biasviz.summaries.fused_layer`).
    """
    formula = formula or {}
    n, seq_len = ids.shape
    heads = adapter.n_heads
    varying = {layer: (b := parts.get(("bias", layer))) is not None and not b.shared for layer in layer_list}
    phases = 1 + len(layer_list)

    def phase(k: int, what: str, total: int, unit: str) -> Progress:
        return Progress(total, desc=f"summarise (phase {k} of {phases}): {what}", unit=unit, show=show)

    bank = SampleBank(n, device=dev, directory=scratch)
    torch_path: dict[str, list[int]] = {}  # why the fused kernels left layers to torch -> those layers
    bank.cells_by_sample = gather is None  # torchrun: each process's one mask, compared once the banks are joined
    extras: dict[int, PositionSummary] = {}
    handed = False
    try:
        # the forward counts each sample through each layer
        with phase(1, "forward", n * (max(layer_list) + 1), "layer") as bar, adapter.keep(layer_list, bank, bar.update):
            for start in range(0, n, batch):
                bank.start = start
                try:
                    with autocast_as(caller):
                        adapter.forward(torch.from_numpy(ids[start : start + batch]).to(dev))
                except MasksDifferBySample as why:  # a scale or bias rows formed again cannot take: streamed from here
                    if gather is not None:  # (torchrun's processes would not turn with it)
                        raise
                    handed = True
                    raise StreamFrom(why, bank, start) from None
                check_interrupted()
        if gather is not None:
            joined = gather(bank)
            bank.close()
            if joined is None:
                return None
            bank, n = joined, joined.samples
            check_one_mask(bank, layer_list)
        for (kind, layer), part in list(parts.items()):  # a call taken part-way as one that sees every key (its
            if part.causal != adapter.layer_causal(layer):  # parts took no row yet: summarised as such from the start)
                parts[kind, layer] = QuantitySummary(kind, layer, heads=heads, seq_len=seq_len, block=block,
                                                     causal=not part.causal, mode=part.mode, device=dev, samples=n)
        for k, layer in enumerate(layer_list, start=2):
            causal = adapter.layer_causal(layer)  # else its rows are formed against every key
            own = {kind: p for (kind, at), p in parts.items() if at == layer}
            cells = SampleCells.read(bank, layer, n, seq_len, dev, block)  # samples masked differently: their own
            # a model's own mask: every quantity over its cells (docs/hdf5.md, 'Attended cells')
            mask = adapter.attended(layer)
            attended = (Attended(cells.union) if cells is not None
                        else None if mask is None else Attended(mask.to(dev)))  # fmt: skip
            for part in own.values() if attended is not None else ():
                part.attend(attended)
            # a bias the forward kept as f(i - j) (a traced call's ALiBi, T5's buckets) is a table as a scheme's is;
            # one kept as g(j) (BLOOM's m·j) a row of keys, one kept cell by cell read so; FIRE's its MLP's terms,
            # the same for every input; a bias of each sample's own from two values a position (CABLE's, FoX's), or its
            # own row of keys (BLOOM's beside padding), formed from the bank only where the kernels may take the layer
            kept, formed = None, None
            if layer not in formula and adapter.adds_bias:
                if (found := adapter.kept_bias(layer)) is not None:
                    form, values = found
                    kept = CellBias(values) if form == "cells" else KeyBias(values) if form == "key" else values
                else:
                    formed = mlp_bias(adapter.scheme_module(layer), seq_len)
                    if formed is None and fused_available(dev) is None:
                        ends = adapter.bias_ends(layer, bank)
                        own_keys = adapter.sample_keys(layer, bank) if ends is None else None
                        formed = (SampleEnds(ends) if ends is not None
                                  else None if own_keys is None else SampleKeys(own_keys))  # fmt: skip
            fused, why = _fused(adapter, bank, layer, own, cells=cells, attended=attended,
                                table=formula.get(layer, kept if formed is None else formed), kept=kept is not None,
                                samples=n,
                                seq_len=seq_len, block=block, device=dev, positional=positional, measures=measures,
                                show=functools.partial(phase, k, f"layer {layer}, fused", 1, "layer"))  # fmt: skip
            if fused is not None:
                # the statistics the kernels do not implement: every sample's rows formed again for them
                reducers = build(samples=n, heads=heads, seq_len=seq_len, block=block, causal=causal, device=dev,
                                 held={*fused.reduced, *(fused.measures or ())}, measures=measures)  # fmt: skip
                with torch.inference_mode():
                    feed_again(lambda at, a, r0, r1, b: adapter.rows_again(at, bank, a, r0, r1, b), layer, reducers,
                               samples=n, seq_len=seq_len, heads=heads, device=dev,
                               mask=None if cells is not None else attended, causal=causal)  # fmt: skip
                reduced, measured = split(results(reducers))
                fused.reduced.update(reduced)
                if fused.measures is not None:
                    fused.measures.update(measured)
                extras[layer] = fused
                bank.drop(layer)
                continue
            torch_path.setdefault(why, []).append(layer)
            extra = _layer_extras(adapter, bank, layer, own, attended, cells, samples=n, seq_len=seq_len,
                                  block=block, device=dev, positional=positional, measures=measures)  # fmt: skip
            count = len(list(row_blocks(seq_len, heads, dev, varying[layer], by_sample=cells is not None,
                                        causal=causal)))  # fmt: skip

            def form(layer: int, a: int, r0: int, r1: int, want_bias: bool) -> RowBlock:
                return adapter.rows_again(layer, bank, a, r0, r1, want_bias)

            for again in (False, True):  # again: a declared bias measured to differ, read at the layer's end
                if again:
                    for part in own.values():
                        part.restart()
                    extra = _layer_extras(adapter, bank, layer, own, attended, cells, samples=n, seq_len=seq_len,
                                          block=block, device=dev, positional=positional, measures=measures)
                    count = len(list(row_blocks(seq_len, heads, dev, True, by_sample=cells is not None,
                                                causal=causal)))  # fmt: skip
                what = f"layer {layer}" + (", again with the bias per sample" if again else "")
                with torch.inference_mode(), phase(k, what, n * count, "block") as bar:
                    try:
                        replay_layer(form, layer, own, extra, samples=n, seq_len=seq_len, heads=heads, device=dev,
                                     adds_bias=bool(adapter.adds_bias), tick=bar.update,
                                     formula=layer in formula and not again, causal=causal)  # fmt: skip
                        break
                    except DiffersPartWay:
                        continue
            bias = None if extra.bias_distance is None else extra.bias_distance.sums()
            frequency = ({} if not measures
                         else {**rotary_measures(adapter, bank, layer, heads, attended, positional and causal,
                                                 own=cells is not None, bias=bias),
                               **profile_errors(extra.profiles, own, n), **block_errors(extra.blocks)})  # fmt: skip
            if measures and cells is not None and cells.samples is not None:  # how many samples a
                frequency[SAMPLES_PER_CELL] = samples_per_cell(cells.samples, cells.union, block, heads)  # cell has
            bank.drop(layer)
            positional = None if extra.positional is None else extra.positional.result()
            if positional is not None and not adapter.adds_bias:  # the pairs summed against P itself
                add_pair_sum_residual(frequency, positional[1][0], attended)
            p_mean, p_profile, shares = host_arrays(  # one wait for every copy
                None if positional is None else positional[0], None if positional is None else positional[1],
                None if attended is None else attended.block_shares(block, heads))
            reduced, measured = split(results(extra.reducers))
            extras[layer] = PositionSummary(
                positional_mean=p_mean,
                positional_profile=p_profile,
                positional_diagnostics=None if positional is None else positional[2],
                reduced=reduced,
                attended=shares,
                measures={**measured, **frequency} if measures else None,
                note=None if cells is None else BY_SAMPLE_NOTE,
            )
    finally:
        if not handed:  # (a bank handed on is closed by its receiver)
            bank.close()
    if dev.type == "cuda":  # one line per reason, where a GPU's layers were left to torch (unless the user chose it)
        for why, layers in torch_path.items():
            if why != CHOSEN:
                tell(layers, why)
    return extras


def _fused(adapter: ModelAdapter, bank: SampleBank, layer: int, own: dict[str, QuantitySummary], *,
           cells: SampleCells | None, attended: Attended | None, table: Bias | None, samples: int,
           seq_len: int, block: int, device: torch.device, positional: bool, measures: bool,
           show: Callable[[], Progress], kept: bool = False) -> tuple[PositionSummary | None, str]:  # fmt: skip
    """The layer summarised by the fused kernels where they cover it; else None (the torch path's turn) and why.
    ``kept``: ``table`` is the bias the forward kept, the same for every sample, whose own summary is then the table's
    (as a declared scheme's is, ``direct`` in :func:`~biasviz.extraction.summary.summarise`); a :class:`KeyBias` (a
    row of keys g(j)), a :class:`CellBias` (kept cell by cell) and an :class:`MlpBias` (FIRE's, declared the same for
    every input and measured so by :func:`fused_layer`) are not a table of distance: their summary is formed from one
    sample's rows."""
    why = why_not(adapter, bank, layer, device, by_sample=cells is not None,
                  mask=None if attended is None else attended.mask, table=table, block=block)  # fmt: skip
    got = None
    if why is None:
        formed = isinstance(table, (MlpBias, CellBias))  # not a table of distance: its rows summarised here
        bias = own.get("bias") if kept or formed else None
        if bias is not None and table is not None:  # given before the kernels' SEs, which read it
            bias.given = (toeplitz_summary(table, seq_len, block, samples=samples) if torch.is_tensor(table)
                          else first_rows_summary(adapter, bank, layer, bias, samples=samples))  # fmt: skip
        refused = None  # Triton could not build or launch the kernels for this GPU: this layer and later ones to torch
        with torch.inference_mode(), show() as bar:
            try:
                got = fused_layer(adapter, bank, layer, own, samples=samples, seq_len=seq_len, block=block,
                                  device=device, positional=positional, measures=measures, table=table,
                                  attended=attended, cells=cells, measured=kept)  # fmt: skip
            except Exception as exc:
                if (refused := kernels.refused(device, exc)) is None:
                    raise
            bar.update(1)
        if bias is not None and bias.given is not None:  # taken back where the torch path forms the layer after all
            bias.given = None if got is None else replace(bias.given, difference=bias.difference)
        why = "" if got is not None else refused or ("a sample's bias differs from the first sample's" if formed
                                                     else "a sample's bias differs from the scheme's f(i - j)")
    return got, why


def first_rows_summary(adapter: ModelAdapter, bank: SampleBank, layer: int, part: QuantitySummary, *,
                       samples: int) -> Summary:  # fmt: skip
    """The summary of a bias the same for every sample (a row of keys or cells the forward kept, compared with each
    exactly as it was kept; FIRE's, which :func:`fused_layer` measures so) that is not a table of distance: the first
    sample's rows, formed block by block on the device and summarised as a bias declared the same for every input is
    (its spread 0), once, not once a sample."""
    one = QuantitySummary("bias", layer, heads=part.heads, seq_len=part.seq_len, block=part.block, causal=True,
                          mode="shared", device=part.device, samples=samples)  # fmt: skip
    for r0, r1 in row_blocks(part.seq_len, part.heads, part.device, False):
        rows = adapter.bias_again(layer, bank, 0, r0, r1)
        assert rows is not None
        one.add_moments(r0, rows.float())
    one.samples = samples
    return one.result(total_samples=samples)


def _layer_extras(adapter: ModelAdapter, bank: SampleBank, layer: int, own: dict[str, QuantitySummary],
                  attended: Attended | None, cells: SampleCells | None, *, samples: int, seq_len: int, block: int,
                  device: torch.device, positional: bool, measures: bool) -> LayerExtras:  # fmt: skip
    """What docs/positional.md and docs/position-measures.md add to a layer whose rows are formed again, over the call's
    own mask (``attended``); where samples are masked differently (``cells``), each sample's own cells count for it, and
    what pairs the cells of different samples (P and its measures) is left out."""
    n, heads, shared = samples, adapter.n_heads, None if cells is not None else attended
    causal = adapter.layer_causal(layer)
    extra = LayerExtras(positional=None, by_sample=cells is not None, mask=shared,
                        reducers=build(samples=n, heads=heads, seq_len=seq_len, block=block, causal=causal,
                                       device=device, measures=measures))  # fmt: skip
    if cells is not None:
        warnings.warn(f"attention call {layer}: {BY_SAMPLE_NOTE}", stacklevel=4)
    if measures:  # docs/position-measures.md
        extra.profiles = per_sample_profiles(own, samples=n, heads=heads, seq_len=seq_len, causal=causal,
                                             device=device)  # fmt: skip
        extra.blocks = sample_blocks([kind for kind, p in own.items() if not p.shared], heads=heads,
                                     seq_len=seq_len, block=block, causal=causal, samples=n, device=device,
                                     attended=shared)  # fmt: skip
        if cells is not None:  # each sample's block means over its own cells, which its rows bring
            return extra
        # P's profile SE, causal calls (as streamed ones): its delete-one P holds the others' mean bias
        if n >= MIN_SE_SAMPLES and positional and adapter.adds_bias and causal:
            extra.bias_distance = BiasByDistance(samples=n, heads=heads, seq_len=seq_len, device=device)
    if n >= 2 and positional and cells is None:
        q_sum, k_sum = (bank.sample_sum(layer, name, heads) for name in ("q", "k"))
        scale = adapter.score_scale(layer)
        extra.positional = Positional(q_sum, k_sum, layer=layer, scale=scale, samples=n, seq_len=seq_len,
                                      block=block, device=device, causal=causal, attended=attended)  # fmt: skip
        if measures and n >= 3 and causal:  # its block map's SE (docs/position-measures.md): causal calls, as streamed
            extra.blocks["positional"] = PositionalJackknife(q_sum, k_sum, bank.operands(layer), samples=n,
                                                             block=block, scale=scale, seq_len=seq_len,
                                                             device=device, attended=attended)  # fmt: skip
    return extra
