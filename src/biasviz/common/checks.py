"""Checks of option values that every entry point (command line, config file, Python API) shares.

Each returns the value or raises a :class:`BiasvizError` naming the option, before any work starts.
"""

from __future__ import annotations

import math

from biasviz.common.errors import BiasvizError

MAX_SEED = 2**63 - 1  # numpy and torch take seeds up to this


def check_seed(seed: int) -> int:
    """A seed numpy and torch both accept: 0 to 2^63 - 1."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise BiasvizError(f"--seed must be a whole number from 0 to 2^63 - 1, not {seed}")
    return seed


def check_learning_rate(lr: float) -> float:
    """A learning rate training can use: positive and finite (nan, inf, 0 and negatives train nothing)."""
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise BiasvizError(f"--lr must be a positive number, not {lr}")
    return float(lr)
