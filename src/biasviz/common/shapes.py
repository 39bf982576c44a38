"""How the summaries shape their work for a device: cache-sized steps on a CPU, few large kernels on a GPU.

A GPU runs what it is sent asynchronously: a Python loop of small steps pays a launch for every operation, and
every value read on the host (``.item()``, ``bool(tensor)``, ``.cpu()``) waits for all the work before it. So on a
GPU the summaries take steps of at least :data:`GPU_STEP_CELLS` cells, keep flags and running sums on the device
and read them once per layer, and use torch's own kernels where the CPU path takes numpy's. :func:`gpu_shaped` is
the one place that decides; :func:`gpu_shapes` forces the GPU's shapes on the CPU, so that a test can count what a
GPU would be sent without one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

GPU_STEP_CELLS = 1 << 26  # (head, query, key) cells a GPU step takes at least: 256 MiB of float32, a few kernels
_forced = [False]  # gpu_shapes(): the GPU's shapes on any device


def gpu_shaped(device: torch.device | str) -> bool:
    """Whether work on ``device`` takes a GPU's shape (any device but the CPU, or the CPU inside
    :func:`gpu_shapes`).

    >>> gpu_shaped(torch.device("cpu")), gpu_shaped(torch.device("cuda"))
    (False, True)
    """
    return torch.device(device).type != "cpu" or _forced[0]


def step_cells(device: torch.device | str, cpu_cells: int) -> int:
    """Cells a step takes on ``device``: ``cpu_cells`` (sized for a core's cache) on a CPU, at least
    :data:`GPU_STEP_CELLS` on a GPU.

    >>> step_cells("cpu", 1 << 22) == 1 << 22, step_cells("cuda", 1 << 22) == GPU_STEP_CELLS
    (True, True)
    """
    return max(cpu_cells, GPU_STEP_CELLS) if gpu_shaped(device) else cpu_cells


@contextlib.contextmanager
def gpu_shapes() -> Iterator[None]:
    """Inside the block, the CPU takes the GPU's shapes (for tests that count what a summary dispatches)."""
    before, _forced[0] = _forced[0], True
    try:
        yield
    finally:
        _forced[0] = before


def host_arrays(*tensors: torch.Tensor | None) -> list[np.ndarray | None]:
    """Each tensor as a numpy array on the host (None stays None). From a GPU every copy goes through pinned memory
    and is queued before one wait for all of them; ``.cpu()`` each would wait once a tensor, through pageable memory.

    >>> [a.tolist() for a in host_arrays(torch.tensor([1.0]), torch.tensor([2]))]
    [[1.0], [2]]
    """
    held: list[torch.Tensor | None] = []
    streams = {}
    for t in tensors:
        if t is None or t.device.type != "cuda":
            held.append(None if t is None else t.detach().cpu())
            continue
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t.detach(), non_blocking=True)
        streams[t.device] = torch.cuda.current_stream(t.device)
        held.append(host)
    for stream in streams.values():  # the one wait: every copy queued before it
        stream.synchronize()
    return [None if t is None else t.numpy() for t in held]
