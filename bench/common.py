"""Small helpers shared by the benchmark scripts (formatting, memory readings)."""

from __future__ import annotations

import resource
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

MIB = 1024 * 1024
GIB = 1024 * MIB


def fmt_range(values: Sequence[float], digits: int = 2) -> str:
    """``median [min-max]`` of repeated measurements, e.g. ``1.23 [1.20-1.31]``."""
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def current_rss_bytes() -> int:
    return _status_bytes("VmRSS")


def peak_hwm_bytes() -> int:
    """This process's peak resident memory (VmHWM), reset by exec, unlike a forked child's ru_maxrss."""
    return _status_bytes("VmHWM")


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    return 0


def timed_into_temporary(run: Callable[[Path], object]) -> dict[str, float]:
    """``run(out)`` with ``out`` a file in a temporary directory: its seconds (``s``) and this process's peak resident
    memory so far (``peak_gib``), as the interleaved benchmarks print them."""
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run(Path(tmp) / "s.h5")
        seconds = time.perf_counter() - t0
    return {"s": seconds, "peak_gib": peak_hwm_bytes() / GIB}
