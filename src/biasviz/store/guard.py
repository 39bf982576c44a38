"""Opening an HDF5 file from elsewhere in a child process first, with a time limit.

A crafted or damaged file can make the HDF5 library loop, or crash, while it is opened and checked. The
commands that read files given to them (``info``, ``plot``, ``diagnose``) therefore open and validate
each file once in a child process: a hang becomes an error after ``BIASVIZ_HDF5_TIMEOUT`` seconds
(default 60) and a crash an error naming the signal, while biasviz itself carries on. The child costs
about a quarter of a second (a Python start and h5py's import), small beside drawing a figure.

``python -m biasviz.store.reader FILE`` is the child, started isolated (:mod:`biasviz.common.children`): exit 0
when the file is valid, else 1 with the error on stdout.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
from pathlib import Path

from biasviz.common.children import run_module
from biasviz.common.errors import BiasvizError

TIMEOUT_ENV = "BIASVIZ_HDF5_TIMEOUT"
DEFAULT_TIMEOUT = 60.0
LONGEST_TIMEOUT = 7 * 24 * 3600.0  # a week: beyond it a value is a typo, not a slow disk


def time_limit() -> float:
    """Seconds the child may take (``BIASVIZ_HDF5_TIMEOUT``)."""
    text = os.environ.get(TIMEOUT_ENV, "")
    try:
        value = float(text) if text.strip() else DEFAULT_TIMEOUT
    except ValueError:
        value = math.nan
    if not 0 < value <= LONGEST_TIMEOUT:  # NaN fails this too
        raise BiasvizError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds between 0 and {LONGEST_TIMEOUT:g} "
                           f"(default {DEFAULT_TIMEOUT:g})")  # fmt: skip
    return value


def check_isolated(path: Path) -> None:
    """Open and validate ``path`` in a child process; its error, a time-out or a crash becomes a BiasvizError."""
    limit = time_limit()
    try:
        proc = run_module("biasviz.store.reader", os.path.abspath(path), timeout=limit)
    except subprocess.TimeoutExpired:
        raise BiasvizError(f"{path} took longer than {limit:g} s to open and check: it is damaged or made to hang "
                           f"a reader (a slow disk? raise {TIMEOUT_ENV})") from None  # fmt: skip
    if proc.returncode == 0:
        return
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise BiasvizError(f"{path} crashed the HDF5 library ({name}) when opened: it is damaged or crafted; "
                           "extract it again")  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    raise BiasvizError(lines[-1] if lines else f"{path} could not be opened (exit code {proc.returncode})")
