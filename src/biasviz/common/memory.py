"""Refusing work that cannot fit in memory, before it starts, with the size it would need.

The estimates are lower bounds (the arrays that must exist at once), so a run they refuse could never
have finished; one they let through may still need more.
"""

from __future__ import annotations

import os
import resource
from typing import Any

from biasviz.common.errors import BiasvizError

FLOAT32 = 4


def size_text(n: float) -> str:
    """Bytes in binary units: ``'7.3 TiB'``.

    >>> size_text(3 * 2**30), size_text(512)
    ('3.0 GiB', '512 B')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} EiB"  # pragma: no cover


def memory_of(device: Any = None) -> int | None:
    """All the memory ``device`` has (bytes): the GPU's for CUDA, else the machine's RAM and swap."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(device)[1])
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    swap = 0
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            swap = next((int(line.split()[1]) * 1024 for line in f if line.startswith("SwapTotal:")), 0)
    except OSError:
        pass
    return ram + swap


def process_limit() -> int | None:
    """The smallest soft limit on this process's memory (ulimit -v / -d, a job scheduler's), None where none is set."""
    limits = [soft for soft in (resource.getrlimit(which)[0] for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA))
              if soft != resource.RLIM_INFINITY]  # fmt: skip
    return min(limits) if limits else None


def memory_budget() -> int | None:
    """Bytes this process may allocate: the machine's memory, or less under a limit (ulimit -v / -d)."""
    known = [n for n in (memory_of(), process_limit()) if n is not None]
    return min(known) if known else None


LIMITED = "this process may use (its limit: ulimit -v or -d, or a job scheduler's)"


def check_fits(needed: int, what: str, fix: str, device: Any = None) -> None:
    """Refuse ``needed`` bytes (for ``what``) when they exceed all the memory of ``device``: a GPU's, or on the host
    what this process may use (:func:`memory_budget`: a cluster's limit below the machine's memory counts); ``fix``
    says how."""
    if getattr(device, "type", "cpu") == "cuda":
        have, where = memory_of(device), "the GPU has"
    else:
        machine, limit = memory_of(), process_limit()
        limited = limit is not None and (machine is None or limit < machine)
        have, where = (limit, LIMITED) if limited else (machine, "this machine has")
    if have is not None and needed > have:
        raise BiasvizError(f"{what} needs about {size_text(needed)} of memory, more than the {size_text(have)} "
                           f"{where}; {fix}")  # fmt: skip


def attention_bytes(batch: int, heads: int, seq_len: int, matrices: int = 1) -> int:
    """``matrices`` float32 (batch, heads, T, T) arrays."""
    return matrices * batch * heads * seq_len * seq_len * FLOAT32


def check_summary_memory(heads: int, seq_len: int, block: int) -> None:
    """Refuse, before any work, a summary whose accumulators cannot fit on the host: each map a sum and a sum of
    squares in float64 over (head, block, block), each profile the same over (head, distance), and the scheme's
    table of values by distance."""
    blocks = -(-seq_len // block)
    needed = 2 * 8 * heads * blocks * blocks + 2 * 8 * heads * 2 * seq_len + 8 * seq_len
    check_fits(needed, f"a summary of {heads} heads over {seq_len} positions in {blocks} x {blocks} blocks",
               "use a smaller --resolution or a shorter --seq-len")  # fmt: skip
