"""``extract --summary``: what figures and diagnostics read, reduced where the model runs and written once.

A per-cell spread over samples needs every sample's value of a cell at once. Adapters that can form a layer's
rows again (biasviz's own models) keep per sample only what forms them (q, k, the layer's input) and then
form each layer block of query rows by block of rows over all samples (:mod:`biasviz.summaries.replay`):
time linear in the number of samples, memory one batch plus that bank. Other adapters stream the blocks
they form (:meth:`ModelAdapter.stream`) into per-cell moments of the (H, T, T) matrix, merged batch after
batch (or, in one batch, reduced at once). Nothing of size N·T² is ever held.

A bias the scheme declares the same for every input is measured, not assumed (docs/hdf5.md, 'Summary files'): every
sample's bias rows are compared with the first sample's as they come (:mod:`biasviz.summaries.sharing`), and the largest
difference over samples, layers and used cells is the root attribute ``bias_max_difference``, as in full files. Replayed
models form each sample's bias rows anyway (the scores need them):
:meth:`~biasviz.adapters.again.FormsRowsAgain.rows_again` passes them on, formed by the model's own scheme module from
that sample's own layer input as its forward formed what it passed through ``hook_bias``; comparing them costs one read
per sample and block, no pass over the model. Streamed models send every
sample's blocks as the hooks see them; over several batches the first sample's (H, T, T) rows are kept, beside the
per-cell moments of the same size that such a run keeps anyway. While every sample equals the first, one is summarised
for all (or, for a bias of i - j alone, its f(d)); from the first difference on, the layer's bias is summarised per
sample like a context-dependent one, so its spread and context dependence are measured. torchrun's processes that merge
per-cell moments cannot compare with process 0's first sample: they summarise every sample's bias and record no
difference.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biasviz.adapters.again import forms_rows_again
from biasviz.adapters.base import ModelAdapter, RowBlock
from biasviz.common.devices import autocast_as, autocast_dtypes, evaluating, placed, without_autocast
from biasviz.common.errors import AttendsPastQuery, BiasvizError, check_interrupted
from biasviz.common.memory import attention_bytes, check_fits, check_summary_memory
from biasviz.common.progress import Progress
from biasviz.extraction.call_masks import CallMasks, widen
from biasviz.extraction.replayed import Gather, replayed
from biasviz.extraction.run import (
    ExtractResult,
    _dtype_label,
    _new_output,
    _where_to_run,
    bias_is_shared,
    check_windows,
    provenance,
)
from biasviz.extraction.stream_from import StreamFrom, formed_before
from biasviz.extraction.summary_plan import SummaryFacts, plan
from biasviz.store.datasets import MIN_SE_SAMPLES
from biasviz.store.format import BIAS_DIFFERENCE, DEFAULT_RESOLUTION, MASK, SE_NOTE, block_size
from biasviz.store.summary_writer import write_summary_file
from biasviz.summaries import QuantitySummary, Summary
from biasviz.summaries.attended import triangle_share
from biasviz.summaries.position import PositionSummary
from biasviz.summaries.sample_blocks import map_errors
from biasviz.summaries.streamed_position import StreamedPosition
from biasviz.summaries.toeplitz import distance_values, toeplitz_summary

MAX_RESOLUTION = 2**31 - 1  # R above T is the exact map as R = T is; beyond this it is only a number to refuse


def resolve_resolution(resolution: int | None, seq_len: int) -> int:
    """R: as given (at least 1), or the default 1024 capped at T. R >= T gives blocks of one position: the maps
    exact per cell (docs/hdf5.md, 'Summary files'), as with R = T; R is stored as given."""
    if resolution is None:
        return min(DEFAULT_RESOLUTION, seq_len)
    if isinstance(resolution, bool) or not isinstance(resolution, (int, np.integer)) or resolution < 1:
        raise BiasvizError(f"--resolution must be a whole number of at least 1, not {resolution!r}")
    if resolution > max(seq_len, MAX_RESOLUTION):  # stored as given: an attribute holds 64 bits at most
        raise BiasvizError(f"--resolution {resolution} is beyond any map biasviz can write; --resolution {seq_len} "
                           "(or anything from --seq-len up) already gives the exact per-cell map")  # fmt: skip
    return int(resolution)


# joins other processes' per-cell moments, and their docs/positional.md sums of streamed layers (a dict by layer), into
# process 0's: True where this process holds the joined result
Merge = Callable[[dict[tuple[str, int], QuantitySummary], Mapping[int, StreamedPosition]], bool]


def summarise(
    adapter: ModelAdapter, ids: np.ndarray, layer_list: list[int], dev: torch.device, *, resolution: int,
    batch_size: int, progress: bool | None = None, merge: Merge | None = None, total_samples: int | None = None,
    scratch: str | Path | None = None, gather: Gather | None = None, positional: bool = True,
    measures: bool = True, streamed: bool = False,
) -> dict[int, dict[str, Any]]:  # fmt: skip
    """Run ``adapter`` over ``ids`` (N, T) and return the summaries of ``layer_list`` (the model is in place).

    Samples run in batches of ``batch_size``. Adapters that can form a layer's rows again
    (:func:`~biasviz.adapters.again.forms_rows_again`) keep per sample what forms them (q, k, the layer's input; in
    memory, or in an anonymous file in ``scratch`` beyond the bank's budget) and form the rows block by block over all
    samples afterwards (:mod:`biasviz.summaries.replay`): time linear in N, memory one batch plus the bank.
    Others keep per-cell moments of the whole matrix, (H, T, T), merged batch after batch.

    ``merge`` (torchrun): per-cell moments are kept whatever the batch, and ``merge`` joins every process's into these
    before they are summarised; ``total_samples`` is then the number of samples over all processes. ``gather``
    (torchrun, adapters that form rows again): the processes' banks are joined on process 0, which forms the rows of
    every sample as one process would; the other processes return an empty result. ``positional=False`` leaves out the
    positional logits P (docs/positional.md), ``measures=False`` docs/position-measures.md's measures of the weights: to
    measure what they cost. Where samples turn out to be masked differently (padding, packed documents), rows formed
    again keep each sample's own cells (one set a head where its heads differ too); where they cannot (a scale or a
    bias that changes between samples), the rows are streamed from the batch that shows it on, the samples before formed
    again from what their forward kept into the same sums (:mod:`biasviz.extraction.stream_from`: only that batch runs
    again; torchrun's joined banks refuse it). A call causal in the first sample that attends keys after a query in a
    later one is taken as a call that sees every key, within its own mask, from there on, the samples before keeping
    the cells they attended; nothing runs again.
    """
    options = {"resolution": resolution, "batch_size": batch_size, "progress": progress, "merge": merge,
               "total_samples": total_samples, "scratch": scratch, "gather": gather, "positional": positional,
               "measures": measures}  # fmt: skip
    options["caller"] = autocast_dtypes()  # the model runs under the caller's autocast; biasviz's own math does not
    for layer in layer_list:  # whether each call rotates: a short pass of the model, as the caller runs it, done here
        adapter.rotary(layer)
    before: StreamFrom | None = None
    try:
        with without_autocast():
            while True:
                try:
                    return _summarise(adapter, ids, layer_list, dev, streamed=streamed, before=before, **options)
                except AttendsPastQuery as why:  # a kept call under torchrun, whose processes join one mask
                    raise BiasvizError(f"{why}; under torchrun a summary cannot take it part-way: run it in one "
                                       "process") from None  # fmt: skip
                except StreamFrom as turn:
                    # rows formed again hold each sample's own cells (of each head) under one scale and one bias; a
                    # call whose scale or bias changes is streamed from the batch that showed it, as the model forms
                    # it, each sample's own cells counting for it (docs/hdf5.md, 'Attended cells'), the samples before
                    # formed again from the bank
                    warnings.warn(turn.said(), stacklevel=2)
                    streamed, before = True, turn.kept()
    finally:
        if before is not None:  # a run that stopped before it read the bank (refused for memory, interrupted)
            before.bank.close()


def _summarise(
    adapter: ModelAdapter, ids: np.ndarray, layer_list: list[int], dev: torch.device, *, resolution: int,
    batch_size: int, progress: bool | None = None, merge: Merge | None = None, total_samples: int | None = None,
    scratch: str | Path | None = None, gather: Gather | None = None, positional: bool = True,
    measures: bool = True, streamed: bool = False, caller: Mapping[str, str] | None = None,
    before: StreamFrom | None = None,
) -> dict[int, dict[str, Any]]:  # fmt: skip
    """One run of :func:`summarise`: ``streamed`` streams the rows even where they could be formed again; the model's
    forward runs under ``caller``'s autocast; ``before``: the samples a keeping forward reached before the rows turned
    to streaming, formed again from its bank first."""
    n, seq_len = ids.shape
    total = n if total_samples is None else total_samples
    block = block_size(seq_len, resolution)
    check_summary_memory(adapter.n_heads, seq_len, block)
    if merge is not None and block > 1:
        raise BiasvizError("--summary under torchrun needs maps exact per cell (--resolution = --seq-len): the "
                           "spread of a coarser map needs every sample of a cell in one process; run it in one "
                           "process")  # fmt: skip
    chosen = plan(SummaryFacts(forms_rows_again=forms_rows_again(adapter),
                               captures_scores=bool(adapter.captures_scores), adds_bias=bool(adapter.adds_bias),
                               declared_shared=bias_is_shared(adapter), merged=merge is not None,
                               gathered=gather is not None, streamed=streamed, samples=n,
                               batch_size=batch_size))  # fmt: skip
    replay, modes = chosen.formed_again, chosen.modes
    if not replay:  # every layer's per-cell sums at once, beside the forward's own matrices: refused before any work
        heads, many = adapter.n_heads, len(layer_list) > 1
        kept = len(layer_list) * chosen.streamed_bytes(heads, seq_len, samples=n, positional=positional and total >= 2)
        check_fits(kept + attention_bytes(chosen.forward_batch, heads, seq_len),
                   f"a summary of {len(layer_list)} layer{'s' * many} whose rows are streamed as the model forms them "
                   f"(sums of {heads} x {seq_len} x {seq_len} cells kept per layer, for its attention calls cannot be "
                   "formed again: docs/long-contexts.md)", "ask for fewer layers (--layer) or a shorter --seq-len",
                   device=dev)  # fmt: skip
    # a shared bias of i - j alone is summarised from its T values, as long as every sample's rows, formed again for
    # the scores anyway, equal the first's: nothing of it is summarised cell by cell
    direct = {layer: f for layer in layer_list if replay and modes.get("bias") == "shared"
              and (f := distance_values(adapter.scheme_module(layer), seq_len)) is not None}  # fmt: skip

    def part(kind: str, layer: int, mode: str) -> QuantitySummary:
        return QuantitySummary(kind, layer, heads=adapter.n_heads, seq_len=seq_len, block=block,
                               causal=adapter.layer_causal(layer), mode=mode, device=dev, samples=n)  # fmt: skip

    parts = {(kind, layer): part(kind, layer, mode) for layer in layer_list for kind, mode in modes.items()}
    extras: dict[int, PositionSummary] = {}
    if replay:
        got = replayed(adapter, ids, layer_list, dev, parts, batch_size, progress, scratch, block, gather,
                        positional, formula=direct, measures=measures, caller=caller)  # fmt: skip
        if got is None:  # torchrun: process 0 summarises every sample
            return {}
        extras = got
    else:

        def place(layer: int) -> StreamedPosition:
            return StreamedPosition(layer, heads=adapter.n_heads, seq_len=seq_len, samples=total, local=n, block=block,
                                    causal=adapter.layer_causal(layer), device=dev, positional=positional,
                                    measures=measures, rotary=adapter.rotary(layer) if measures else None)  # fmt: skip

        position = {layer: place(layer) for layer in layer_list} if chosen.streamed_position else {}

        def renew(layer: int) -> None:  # its call's rule changed before it took a row: made for the rule it has now
            parts.update({(kind, layer): part(kind, layer, mode) for kind, mode in modes.items()})
            if layer in position:
                position[layer] = place(layer)

        _streamed(adapter, ids, layer_list, dev, parts, chosen.forward_batch, progress, position,
                  merged=merge is not None, caller=caller, before=before, renew=renew)
        held = merge(parts, position) if merge is not None else True
        extras = {layer: p.result() for layer, p in position.items()} if held else {}
    out: dict[int, dict[str, Any]] = {layer: {} for layer in layer_list}
    for (kind, layer), part in parts.items():
        if kind == "bias" and layer in direct and part.shared:  # every sample measured equal
            out[layer][kind] = toeplitz_summary(direct[layer], seq_len, block, samples=total)
            out[layer][kind].difference = part.difference
        else:
            out[layer][kind] = part.result(total_samples=total)
    for layer, extra in extras.items():
        # the maps' SEs the block means did not give (docs/position-measures.md)
        if extra.measures is not None:
            map_errors(extra.measures, out[layer], {k: p for (k, at), p in parts.items() if at == layer},
                       samples=total, block=block)  # fmt: skip
        out[layer]["position"] = extra
        if adapter.layer_causal(layer) and not adapter.causal and extra.attended is None:
            # a causal call in a model whose others see every key (an encoder-decoder's decoder): its own rule
            # travels with it, as the share of each block's cells j <= i (docs/hdf5.md, 'Attended cells')
            extra.attended = triangle_share(seq_len, block, adapter.n_heads)
    return out


Parts = dict[tuple[str, int], QuantitySummary]


def _streamed(adapter: ModelAdapter, ids: np.ndarray, layer_list: list[int], dev: torch.device, parts: Parts,
              batch: int, show: bool | None,
              position: Mapping[int, StreamedPosition] | None = None, merged: bool = False,
              caller: Mapping[str, str] | None = None, before: StreamFrom | None = None,
              renew: Callable[[int], None] | None = None) -> None:  # fmt: skip
    """Every block the model forms goes into ``parts`` as it comes; samples in batches of ``batch``. ``position``:
    the layers whose scores, q and k (and bias and weights) also go into docs/positional.md's sums. ``before``: the
    samples before its ``start`` come first, a sample at a time, formed again from its bank (then closed). A call taken
    as causal that turns out to attend keys after a query (the adapter says so as its blocks come) goes on as one that
    sees every key: its layer's sums widen (:func:`~biasviz.extraction.call_masks.widen`), or, in the first batch,
    ``renew`` makes them again for its rule before they take a row."""
    n = len(ids)
    position = position or {}
    under = [0, 1]  # the batch under way's first sample and size
    masks = CallMasks(adapter, merged)  # what each call attended: written on its blocks
    taken_causal = {layer for layer in layer_list if adapter.layer_causal(layer)}

    def again(layer: int) -> None:
        """``renew`` the layer's sums, under way for the batch at hand."""
        assert renew is not None
        renew(layer)
        for p in [*parts.values(), *position.values()]:
            if p.layer == layer:
                p.begin_batch(under[1])

    def sink(block: RowBlock) -> None:
        layer, block.first = block.layer, under[0]  # the adapter knows the batch, not where it starts
        with without_autocast():  # called from inside the model's forward
            if layer in taken_causal and not adapter.layer_causal(layer):  # its rule turned: its sums widen first
                taken_causal.discard(layer)
                widen(layer, under[0], masks, parts, position, again if under[0] == 0 and renew else None)
            masks.settle(block)
            for kind in ("bias", "weights", "scores"):
                part = parts.get((kind, layer))
                if part is not None:
                    part.add_block(block)
            if layer in position:
                position[layer].add_block(block)

    want_bias = any(kind == "bias" for kind, _ in parts)
    want_scores = any(kind == "scores" for kind, _ in parts)
    with Progress(n, desc="summarise", unit="sample", show=show) as bar:

        def one_batch(start: int, size: int, send: Callable[[], None]) -> None:
            """Samples ``start .. start + size - 1``: ``send`` gives every block of theirs to :func:`sink`."""
            under[:] = start, size
            for p in [*parts.values(), *position.values()]:
                p.begin_batch(size)
            send()
            for p in parts.values():
                p.end_batch()
            bar.update(size)
            check_interrupted()

        def formed(turn: StreamFrom, a: int) -> None:
            with torch.no_grad():  # (not inference mode: the sums the blocks start outlive it, as a stream's)
                for block in formed_before(adapter, turn.bank, layer_list, a, ids.shape[1], want_bias=want_bias,
                                           operands=bool(position)):  # fmt: skip
                    sink(block)

        def forward(chunk: np.ndarray) -> None:
            with autocast_as(caller):
                adapter.forward(torch.from_numpy(chunk).to(dev))  # every block sent by the time it returns

        if before is not None:
            try:
                for a in range(before.start):  # each a batch of one, as a streaming forward of it would send
                    one_batch(a, 1, lambda a=a: formed(before, a))
            finally:
                before.bank.close()
        with adapter.stream(layer_list, want_bias, sink, want_scores):
            for start in range(0 if before is None else before.start, n, batch):
                chunk = ids[start : start + batch]  # (b, T)
                one_batch(start, len(chunk), lambda chunk=chunk: forward(chunk))


def summary_run(
    adapter: ModelAdapter, ids: np.ndarray, *, layers: int | str | list[int] = -1, resolution: int | None = None,
    batch_size: int = 1, device: str | torch.device = "auto", model_dtype: str | torch.dtype | None = None,
    seed: int | None = None, text_source: str = "", attrs: Mapping[str, Any] | None = None,
    progress: bool | None = None, merge: Merge | None = None, total_samples: int | None = None,
    scratch: str | Path | None = None, gather: Gather | None = None, positional: bool = True,
    measures: bool = True,
) -> tuple[dict[str, Any], list[int], dict[int, dict[str, Summary]], int]:  # fmt: skip
    """Checked windows -> (root attributes, layers, summaries, R); the model is left where and as it was."""
    if batch_size < 1:
        raise BiasvizError(f"--batch-size must be at least 1, got {batch_size}")
    r = resolve_resolution(resolution, ids.shape[1])
    dev, run_dtype = _where_to_run(device, model_dtype)
    with evaluating(adapter.model), placed(adapter.model, dev, run_dtype):
        adapter.prepare(ids, layers)
        layer_list = adapter.resolve_layers(layers)
        meta = provenance(adapter, dev, seed=seed, text_source=text_source, batch_size=batch_size, extra=attrs)
        meta["model_dtype"] = _dtype_label(run_dtype, adapter.model)
        summaries = summarise(adapter, ids, layer_list, dev, resolution=r, batch_size=batch_size,
                              progress=progress, merge=merge, total_samples=total_samples,
                              scratch=scratch, gather=gather, positional=positional,
                              measures=measures)  # fmt: skip
    # what the call did beyond c·q·kᵀ + b travels with its layer (docs/hdf5.md, 'Attended cells')
    for layer, got in summaries.items():
        said, position = adapter.call_note(layer), got.get("position")
        if said and position is not None:
            position.note = f"{position.note}; {said}" if position.note else said
    n = len(ids) if total_samples is None else total_samples
    if n < MIN_SE_SAMPLES:  # docs/position-measures.md: the file says why it holds no standard error
        meta[SE_NOTE] = (f"none stored: a standard error needs {MIN_SE_SAMPLES} samples or more; the file holds {n} "
                         f"sample{'s' * (n != 1)}")  # fmt: skip
    own_mask = any(getattr(got.get("position"), "attended", None) is not None for got in summaries.values())
    meta[MASK] = "model" if own_mask else "causal" if adapter.causal else "bidirectional"
    measured = [got["bias"].difference for got in summaries.values() if "bias" in got]
    if measured and all(gap is not None for gap in measured):  # the root attribute of full files, over every layer
        meta[BIAS_DIFFERENCE] = max(measured)
    return meta, layer_list, summaries, r


def extract_summary(
    adapter: ModelAdapter, windows: np.ndarray, out: str | Path, *, force: bool = False, dtype: str = "float32",
    **options: Any,
) -> ExtractResult:  # fmt: skip
    """Summarise ``adapter`` on ``windows`` (samples, T) into the docs/hdf5.md, 'Summary files' file at ``out``.

    ``resolution`` R (default min(1024, T)): maps of at most R x R blocks, exact per cell when R >= T. Other
    ``options`` are :func:`summary_run`'s. ``dtype`` is accepted for symmetry with
    :func:`biasviz.extraction.run.extract`; summaries are always float32.
    """
    t0 = time.perf_counter()
    out = _new_output(out, force)
    ids = check_windows(adapter, windows)
    n, seq_len = ids.shape
    options.setdefault("scratch", out.parent)  # the bank's overflow goes where the user has room for the output
    meta, layer_list, summaries, r = summary_run(adapter, ids, **options)
    write_summary_file(out, attrs=meta, input_ids=ids, n_heads=adapter.n_heads, seq_len=seq_len, resolution=r,
                       block=block_size(seq_len, r), layers=layer_list, summaries=[summaries],
                       causal=bool(adapter.causal), force=force)  # fmt: skip
    seconds = time.perf_counter() - t0
    return ExtractResult(out, n, seq_len, layer_list, bool(adapter.adds_bias), seconds, out.stat().st_size)
