"""``extract --bias-only``: the bias of a context-free scheme from its formula, with no text and no forward pass.

Without ``--resolution`` the file holds the full (1, H, T, T) bias (format 1); with it, the summary layout of
docs/hdf5.md, 'Summary files' (samples = 0, no weights) at any length: a bias of i - j alone from its T values, others
in blocks of query rows.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from biasviz.adapters.base import ModelAdapter
from biasviz.common.devices import placed
from biasviz.common.errors import BiasvizError
from biasviz.common.memory import check_summary_memory
from biasviz.extraction.run import (
    ExtractResult,
    _ChunkSink,
    _dtype_label,
    _new_output,
    _storable,
    _where_to_run,
    check_batch_memory,
    provenance,
)
from biasviz.store import BiasFileWriter
from biasviz.store.compression import parse_compression
from biasviz.store.format import block_size
from biasviz.store.summary_writer import write_summary_file
from biasviz.summaries import QuantitySummary
from biasviz.summaries.toeplitz import distance_values, toeplitz_summary

CELLS_PER_BLOCK = 1 << 22  # bias cells formed at a time when a scheme is summarised row block by row block


def _check(adapter: ModelAdapter, layers: int | str | list[int], seq_len: int) -> list[int]:
    """The layers whose bias can be formed without text, or one clear error."""
    if not adapter.adds_bias:
        raise BiasvizError(f"--bias-only: the '{adapter.scheme}' scheme adds no bias")
    if adapter.context_dependent:
        raise BiasvizError(f"--bias-only needs a context-free scheme; this '{adapter.scheme}' bias depends on the "
                           "input: extract it from text (drop --bias-only)")  # fmt: skip
    if not adapter.n_layers:
        raise BiasvizError(f"--bias-only: the bias of a traced model ({adapter.architecture}) exists only inside its "
                           "attention calls; extract it from text (drop --bias-only)")  # fmt: skip
    layer_list = adapter.resolve_layers(layers)
    if any(adapter.scheme_module(layer) is None for layer in layer_list):
        raise BiasvizError(f"--bias-only: the {adapter.architecture} model builds its bias inside the attention; "
                           "extract it from text (drop --bias-only)")  # fmt: skip
    if seq_len < 1:
        raise BiasvizError(f"--seq-len must be at least 1, got {seq_len}")
    adapter.check_length(seq_len)
    return layer_list


def extract_bias_only(
    adapter: ModelAdapter,
    seq_len: int,
    out: str | Path,
    *,
    layers: int | str | list[int] = -1,
    dtype: str = "float32",
    device: str | torch.device = "auto",
    model_dtype: str | torch.dtype | None = None,
    force: bool = False,
    compression: Any = None,
) -> ExtractResult:
    """The bias of a context-free scheme over T positions, with no text and no forward pass (one sample).

    The file holds ``/layer_{L}/bias`` only (root attribute ``bias_only``), and ``input_ids`` of -1: no
    token was read. Memory is the (1, H, T, T) bias of each requested layer plus the writer's.
    """
    t0 = time.perf_counter()
    out = _new_output(out, force)
    layer_list = _check(adapter, layers, seq_len)
    dev, run_dtype = _where_to_run(device, model_dtype)
    check_batch_memory(adapter, len(layer_list), 1, seq_len, dev, fix="use fewer layers (--layer) or a shorter "
                       "--seq-len, or --resolution R, which keeps the bias's block means instead")  # fmt: skip
    meta = provenance(adapter, dev, seed=None, text_source="none (--bias-only: no text, no forward pass)",
                      batch_size=1, extra={"bias_only": True})  # fmt: skip
    meta["model_dtype"] = _dtype_label(run_dtype, adapter.model)
    writer = BiasFileWriter(out, attrs=meta, n_samples=1, n_heads=adapter.n_heads, seq_len=seq_len, layers=layer_list,
                            has_bias=True, has_weights=False, dtype=dtype, force=force,
                            causal=bool(adapter.causal), **parse_compression(compression).filters)  # fmt: skip
    with placed(adapter.model, dev, run_dtype), torch.inference_mode(), writer, _ChunkSink(writer, dev) as sink:
        biases = {("bias", layer): _storable(adapter.scheme_module(layer)(None, seq_len, seq_len))  # (1, H, T, T)
                  for layer in layer_list}  # fmt: skip
        sink.put(np.full((1, seq_len), -1, dtype=np.int64), biases)  # no token was read
    return ExtractResult(out, 1, seq_len, layer_list, True, time.perf_counter() - t0, out.stat().st_size)


def bias_only_summary(
    adapter: ModelAdapter, seq_len: int, out: str | Path, *, layers: int | str | list[int] = -1,
    resolution: int | None = None, device: str | torch.device = "auto", model_dtype: str | torch.dtype | None = None,
    force: bool = False,
) -> ExtractResult:  # fmt: skip
    """The docs/hdf5.md, 'Summary files' summary of a context-free bias over ``seq_len`` positions, from the formula
    alone."""
    from biasviz.extraction.summary import resolve_resolution

    t0 = time.perf_counter()
    out = _new_output(out, force)
    layer_list = _check(adapter, layers, seq_len)
    r = resolve_resolution(resolution, seq_len)
    block = block_size(seq_len, r)
    check_summary_memory(adapter.n_heads, seq_len, block)
    dev, run_dtype = _where_to_run(device, model_dtype)
    meta = provenance(adapter, dev, seed=None, text_source="none (--bias-only: no text, no forward pass)",
                      batch_size=1, extra={"bias_only": True})  # fmt: skip
    meta["model_dtype"] = _dtype_label(run_dtype, adapter.model)
    summaries = {}
    with placed(adapter.model, dev, run_dtype), torch.inference_mode():
        for layer in layer_list:
            scheme = adapter.scheme_module(layer)
            f = distance_values(scheme, seq_len) if adapter.causal else None
            if f is not None:
                summaries[layer] = {"bias": toeplitz_summary(f, seq_len, block, samples=0)}
                continue
            part = QuantitySummary("bias", layer, heads=adapter.n_heads, seq_len=seq_len, block=block,
                                   causal=bool(adapter.causal), mode="shared", device=dev)  # fmt: skip
            if adapter.causal:
                rows = max(1, CELLS_PER_BLOCK // (adapter.n_heads * seq_len))
                for r0 in range(0, seq_len, rows):
                    r1 = min(seq_len, r0 + rows)
                    part.add(r0, scheme(None, r1 - r0, r1))  # (1, H, rows, r1): queries r0 .. r1-1, keys 0 .. r1-1
            else:  # every query sees every key: the matrix at once (bidirectional models)
                part.add(0, scheme(None, seq_len, seq_len))  # (1, H, T, T)
            summaries[layer] = {"bias": part.result(total_samples=0)}
    write_summary_file(out, attrs=meta, input_ids=np.zeros((0, seq_len), dtype=np.int32), n_heads=adapter.n_heads,
                       seq_len=seq_len, resolution=r, block=block, layers=layer_list, summaries=[summaries],
                       causal=bool(adapter.causal), force=force)  # fmt: skip
    return ExtractResult(out, 0, seq_len, layer_list, True, time.perf_counter() - t0, out.stat().st_size)
