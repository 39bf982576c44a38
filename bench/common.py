"""Small helpers shared by the benchmark scripts (formatting, memory readings)."""

from __future__ import annotations

import resource
import statistics
from collections.abc import Sequence
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
