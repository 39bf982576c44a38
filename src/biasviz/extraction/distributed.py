"""Running under ``torchrun``: one process per GPU (or per share of the CPU), joined by torch.distributed.

``torchrun --nproc-per-node=N -m biasviz extract ...`` starts N copies of the command; each learns its
place from the environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK). Extraction splits the samples
into N contiguous blocks, each process writes its block as a complete hidden shard beside ``--out``,
and process 0 joins the shards into the one file at ``--out`` (:mod:`biasviz.store.combine`) - a copy
of the stored chunks, so the file is ordinary and self-contained (a virtual dataset would break as soon
as the file is moved or copied without its shards). Nothing appears at ``--out`` unless every process
succeeded.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from pathlib import Path
from typing import Any

import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.common.out_of_memory import failure_text
from biasviz.common.outputs import check_output_file
from biasviz.common.processes import World, all_true, from_main


def extract_parallel(
    adapter: Any, windows: np.ndarray, out: str | Path, *, w: World, force: bool = False,
    progress: bool | None = None, attrs: dict[str, Any] | None = None, **options: Any,
) -> Any:  # fmt: skip
    """Extract this process's block of ``windows`` into a shard; process 0 joins the shards at ``out``.

    Returns the :class:`~biasviz.extraction.run.ExtractResult` of the joined file in process 0, of the shard
    elsewhere. ``options`` are :func:`biasviz.extraction.run.extract`'s.
    """
    from biasviz.extraction.run import ExtractResult, extract
    from biasviz.store.combine import combine

    t0 = time.perf_counter()
    out = check_output_file(Path(out), force=force)
    if len(windows) < w.size:
        raise BiasvizError(f"--samples {len(windows)} is fewer than the {w.size} processes; each needs at least one")
    token = from_main(secrets.token_hex(4))
    shard = lambda rank: out.with_name(f".{out.name}.{token}.shard{rank}-of-{w.size}.h5")  # noqa: E731
    meta = {**(attrs or {}), "processes": w.size}
    result, failure = None, None
    try:
        try:
            result = extract(adapter, windows[w.block(len(windows))], shard(w.rank), force=True,
                             progress=progress if w.main else False, attrs=meta, **options)  # fmt: skip
        except BiasvizError as exc:  # the others must hear of it before this process stops
            failure = BiasvizError(f"process {w.rank} failed: {exc}")
            failure.__cause__ = exc
        except Exception as exc:  # the model's own code failed (out of memory, say): say where, in one line
            failure = BiasvizError(f"process {w.rank} failed: {failure_text(exc, 'extract')}")
            failure.__cause__ = exc
        if not all_true(failure is None):
            raise failure or BiasvizError(f"another process failed; nothing was written to {out}")
        if w.main:
            try:
                combine([shard(r) for r in range(w.size)], out, along="sample", force=force)
            except Exception as exc:
                failure = exc
        if not all_true(failure is None):
            raise failure or BiasvizError(f"joining the shards failed in process 0; nothing was written to {out}")
    finally:
        with contextlib.suppress(FileNotFoundError):
            shard(w.rank).unlink()
    assert result is not None
    if w.main:
        return ExtractResult(out, len(windows), result.seq_len, result.layers, result.has_bias,
                             time.perf_counter() - t0, out.stat().st_size)  # fmt: skip
    return result


def summarise_parallel(
    adapter: Any, windows: np.ndarray, out: str | Path, *, w: World, force: bool = False,
    progress: bool | None = None, attrs: dict[str, Any] | None = None, **options: Any,
) -> Any:  # fmt: skip
    """``extract --summary`` under torchrun: each process sums its block of samples per cell; process 0 joins
    the per-cell moments (exactly, in rank order) and writes the one file. Maps must be exact per cell."""
    from biasviz.extraction.run import ExtractResult, check_windows
    from biasviz.extraction.summary import summary_run
    from biasviz.store.format import block_size
    from biasviz.store.summary_writer import write_summary_file

    t0 = time.perf_counter()
    out = check_output_file(Path(out), force=force)
    if len(windows) < w.size:
        raise BiasvizError(f"--samples {len(windows)} is fewer than the {w.size} processes; each needs at least one")
    options.pop("dtype", None)  # summaries are float32
    ids = check_windows(adapter, windows)
    failure, result = None, None
    try:
        result = summary_run(adapter, ids[w.block(len(ids))], attrs={**(attrs or {}), "processes": w.size},
                             progress=progress if w.main else False, merge=_join_cells(w),
                             gather=_join_banks(w), total_samples=len(ids), **options)  # fmt: skip
        if w.main:
            meta, layer_list, summaries, r = result
            write_summary_file(out, attrs=meta, input_ids=ids, n_heads=adapter.n_heads, seq_len=ids.shape[1],
                               resolution=r, block=block_size(ids.shape[1], r), layers=layer_list,
                               summaries=[summaries], causal=bool(adapter.causal), force=force)  # fmt: skip
    except BiasvizError as exc:
        failure = exc
    if not all_true(failure is None):
        raise failure or BiasvizError(f"another process failed; nothing was written to {out}")
    assert result is not None
    layers = result[1]
    size = out.stat().st_size if w.main else 0
    return ExtractResult(out, len(ids), ids.shape[1], layers, bool(adapter.adds_bias), time.perf_counter() - t0, size)


def _join_banks(w: World) -> Any:
    """A gather for :func:`biasviz.extraction.summary.summarise`: every process's bank (what forms its samples'
    rows again) joined on process 0 in rank order, the order of the samples; None elsewhere."""
    import torch.distributed as dist

    def gather(bank: Any) -> Any:
        from biasviz.summaries.bank import SampleBank

        mine = {key: bank.every(*key).cpu() for key in bank.names()}  # each sample's own, spilled or not
        gathered: list[Any] | None = [None] * w.size if w.main else None
        dist.gather_object((bank.samples, mine), gathered, dst=0)
        if not w.main:
            return None
        assert gathered is not None
        joined = SampleBank(sum(n for n, _ in gathered), device=bank.device, budget=bank.budget,
                            directory=bank.directory)  # fmt: skip
        for n, arrays in gathered:
            for (layer, name), values in arrays.items():
                joined.put(layer, name, values)
            joined.start += n
        return joined

    return gather


def _one_mask_everywhere(w: World, parts: dict[tuple[str, int], Any]) -> None:
    """Every process summarised its samples over the one mask it measured (docs/hdf5.md, 'Attended cells'); joined, they
    must all have measured the same, or every process refuses (all of them see every digest: none waits on the
    others)."""
    import hashlib

    import torch.distributed as dist

    mine = {layer: None if part.attended is None else hashlib.sha256(part.attended.mask.cpu().numpy().tobytes())
            .hexdigest() for (_, layer), part in sorted(parts.items())}  # fmt: skip
    every: list[Any] = [None] * w.size
    dist.all_gather_object(every, mine)
    for layer in sorted(mine):
        if len({theirs.get(layer) for theirs in every}) > 1:
            raise BiasvizError(f"attention call {layer} masked other cells in one process's samples than in "
                               "another's (padding or packed documents): under torchrun a summary takes one mask "
                               "for every sample; run it in one process")  # fmt: skip


def _join_cells(w: World) -> Any:
    """A merge for :func:`biasviz.extraction.summary.summarise`: every process's per-cell moments into process 0's,
    and a streamed model's docs/positional.md sums (q, k, scores, bias, the key profile's; sink shares one sample after
    another), added in rank order: the order of a one-process run's batches."""
    import torch.distributed as dist

    def merge(parts: dict[tuple[str, int], Any], position: Any = None) -> bool:
        _one_mask_everywhere(w, parts)
        for key in sorted(parts):
            cells = parts[key].cells
            if cells is None:  # a bias shared by every sample: the same in every process
                continue
            mine = (cells.samples, cells.mean.cpu(), cells.m2.cpu())
            gathered: list[Any] | None = [None] * w.size if w.main else None
            dist.gather_object(mine, gathered, dst=0)
            if not w.main:
                continue
            assert gathered is not None
            from biasviz.summaries.moments import Moments

            each = [Moments(n, mean.to(cells.mean.device), m2.to(cells.m2.device)) for n, mean, m2 in gathered]
            joined = each[0]
            for other in each[1:]:  # rank order: the order of a one-process run's batches
                joined = joined.merged(other)
            cells.mean, cells.m2, cells.samples = joined.mean, joined.m2, joined.n
        for layer in sorted(position or {}):
            states: list[Any] | None = [None] * w.size if w.main else None
            dist.gather_object(position[layer].state(), states, dst=0)
            if w.main:
                assert states is not None
                position[layer].join(states)
        return w.main

    return merge
