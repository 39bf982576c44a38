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
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from biasviz.devices import resolve_device
from biasviz.errors import BiasvizError
from biasviz.outputs import check_output_file


@dataclass(frozen=True)
class World:
    """This process's place among the processes torchrun started (one process: rank 0 of 1)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0

    def block(self, n: int) -> slice:
        """This rank's contiguous share of ``n`` items (sizes differ by at most one; rank order = item order)."""
        bounds = np.linspace(0, n, self.size + 1).round().astype(int)
        return slice(int(bounds[self.rank]), int(bounds[self.rank + 1]))


def world() -> World:
    """Read from the environment torchrun sets; a plain run is one process."""
    try:
        size = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
        local = int(os.environ.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise BiasvizError("WORLD_SIZE, RANK and LOCAL_RANK must be integers (as torchrun sets them)") from None
    return World(rank, size, local)


@contextlib.contextmanager
def process_group(device: str) -> Iterator[tuple[World, torch.device]]:
    """Join the other processes (gloo on the CPU, nccl with one GPU per process from LOCAL_RANK).

    Yields this process's place and device; a single process yields at once and joins nothing.
    """
    w = world()
    if w.size == 1 or dist.is_initialized():
        yield w, rank_device(device, w)
        return
    dev = rank_device(device, w)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=w.rank, world_size=w.size)
    try:
        yield w, dev
    finally:
        dist.destroy_process_group()


def rank_device(spec: str, w: World) -> torch.device:
    """The device of process ``w``: under torchrun with CUDA its own GPU (LOCAL_RANK), made current."""
    device = resolve_device(spec)
    if device.type != "cuda" or w.size == 1:
        return device
    if w.local_rank >= torch.cuda.device_count():
        raise BiasvizError(f"process {w.rank} has LOCAL_RANK {w.local_rank} but only {torch.cuda.device_count()} "
                           "GPUs are visible; start at most that many per node")  # fmt: skip
    device = torch.device("cuda", w.local_rank)
    torch.cuda.set_device(device)
    return device


def _device_for_collectives() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def all_true(flag: bool) -> bool:
    """Whether ``flag`` holds in every process (each process passes its own)."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([1 if flag else 0], device=_device_for_collectives())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def from_main(value: Any) -> Any:
    """Process 0's ``value``, in every process."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def extract_parallel(
    adapter: Any, windows: np.ndarray, out: str | Path, *, w: World, force: bool = False,
    progress: bool | None = None, attrs: dict[str, Any] | None = None, **options: Any,
) -> Any:  # fmt: skip
    """Extract this process's block of ``windows`` into a shard; process 0 joins the shards at ``out``.

    Returns the :class:`~biasviz.extraction.ExtractResult` of the joined file in process 0, of the shard
    elsewhere. ``options`` are :func:`biasviz.extraction.extract`'s.
    """
    from biasviz.extraction import ExtractResult, extract
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
            failure = exc
        except Exception as exc:  # the model's own code failed (out of memory, say): say where, in one line
            failure = BiasvizError(f"process {w.rank} failed: {type(exc).__name__}: {exc}")
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
