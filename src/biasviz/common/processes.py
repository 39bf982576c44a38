"""This process's place among the processes torchrun started, and the few collectives biasviz needs.

Training (DDP) and extraction (samples split across ranks) both run under ``torchrun``; a plain run is one
process, rank 0 of 1, and every helper here then does nothing.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from biasviz.common.devices import resolve_device
from biasviz.common.errors import BiasvizError


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
    if not (size >= 1 and 0 <= rank < size and local >= 0):
        raise BiasvizError(f"RANK={rank}, LOCAL_RANK={local} and WORLD_SIZE={size} do not fit together (0 <= RANK < "
                           "WORLD_SIZE, LOCAL_RANK >= 0): start the processes with torchrun")  # fmt: skip
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
    # torch.distributed.nn binds group.WORLD as a default argument when first imported, and transformers
    # imports it with the model: imported after joining, it would keep the group alive past
    # destroy_process_group, and gloo's worker threads, still running at interpreter exit, abort the
    # process when they release the last collective's tensors. Imported now, it binds None.
    import torch.distributed.nn  # noqa: F401

    try:
        dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=w.rank, world_size=w.size)
    except ValueError as exc:  # a rendezvous variable (MASTER_ADDR, MASTER_PORT) missing or malformed
        raise BiasvizError(f"process {w.rank} of {w.size} cannot join the others ({exc}); start the processes "
                           "with torchrun") from None  # fmt: skip
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
