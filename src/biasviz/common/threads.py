"""OpenMP threads that sleep while they wait, so that a busy machine is not made busier.

torch's CPU kernels run on OpenMP threads. Between two parallel regions GNU OpenMP keeps its threads spinning
by default; when other work shares the cores, a spinning thread takes a core from the one doing the work, and
a tiny model's many short regions turn into minutes of CPU time burnt while waiting. With
``OMP_WAIT_POLICY=PASSIVE`` the threads sleep instead. The runtime reads the variable once, when torch loads
it: so it is set before torch is imported, and only where the user has not set it (their value wins).
"""

from __future__ import annotations

import os
import sys

WAIT_POLICY = "OMP_WAIT_POLICY"


def passive_waits() -> bool:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` for this process (and its children) unless it is set already or torch is
    loaded (too late to matter). Returns whether it was set here."""
    if WAIT_POLICY in os.environ or "torch" in sys.modules:
        return False
    os.environ[WAIT_POLICY] = "PASSIVE"
    return True


__all__ = ["WAIT_POLICY", "passive_waits"]
