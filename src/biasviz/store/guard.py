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


# Files a child found valid in this process, by what the file system says of them: a notebook or script that draws
# one file again, or info, plot and diagnose run in one process, start one child for it, not one each time. Any
# write to the file, or a file put in its place, changes its change time (which no user call can set), its size or
# its inode: it is checked again. A file found invalid is always checked again (its error said anew).
_FOUND_VALID: set[tuple[int, ...]] = set()


def _unchanged_since(path: Path) -> tuple[int, ...] | None:
    """What identifies ``path``'s bytes without reading them (device, inode, size, modification and change times)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def check_isolated(path: Path) -> None:
    """Open and validate ``path`` in a child process; its error, a time-out or a crash becomes a BiasvizError.
    Once a child found it valid, the same unchanged file passes without another child in this process."""
    limit = time_limit()
    seen = _unchanged_since(path)
    if seen is not None and seen in _FOUND_VALID:
        return
    try:
        proc = run_module("biasviz.store.reader", os.path.abspath(path), timeout=limit)
    except subprocess.TimeoutExpired:
        raise BiasvizError(f"{path} took longer than {limit:g} s to open and check: it is damaged or made to hang "
                           f"a reader (a slow disk? raise {TIMEOUT_ENV})") from None  # fmt: skip
    if proc.returncode == 0:
        if seen is not None and seen == _unchanged_since(path):  # not changed while the child read it
            _FOUND_VALID.add(seen)
        return
    if proc.returncode < 0:
        name = signal.Signals(-proc.returncode).name
        raise BiasvizError(f"{path} crashed the HDF5 library ({name}) when opened: it is damaged or crafted; "
                           "extract it again")  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    raise BiasvizError(lines[-1] if lines else f"{path} could not be opened (exit code {proc.returncode})")
