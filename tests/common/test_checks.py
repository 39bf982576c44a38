"""The option checks every entry point shares (:mod:`biasviz.common.checks`): a seed numpy and torch both take
(0 to 2^63 - 1) and a learning rate that trains (positive and finite) pass through; anything else is one
BiasvizError naming the option, before any work starts."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from biasviz.common.checks import check_learning_rate, check_seed
from biasviz.common.errors import BiasvizError

LARGEST_SEED = 2**63 - 1  # the largest value of a signed 64-bit integer, what numpy and torch take


@pytest.mark.parametrize("seed", [0, 1, 12345, LARGEST_SEED])
def test_a_seed_numpy_takes_passes_unchanged(seed: int) -> None:
    """The seed is returned as given, and numpy indeed takes it (the bound is not stricter than the libraries)."""
    assert check_seed(seed) == seed
    np.random.default_rng(seed)


@pytest.mark.parametrize("seed", [-1, LARGEST_SEED + 1, 2**64, True, False, 1.0, 1.5, "3", None])
def test_a_seed_out_of_range_or_not_a_whole_number_is_refused_naming_the_option(seed: Any) -> None:
    """Negative seeds, seeds past 2^63 - 1, bools (an int subclass), floats and text: one error naming --seed."""
    with pytest.raises(BiasvizError, match=r"--seed must be a whole number from 0 to 2\^63 - 1"):
        check_seed(seed)


@pytest.mark.parametrize(("lr", "want"), [(1e-3, 0.001), (3, 3.0), (1e-300, 1e-300), (5e4, 50000.0)])
def test_a_positive_finite_learning_rate_passes_as_a_float(lr: float, want: float) -> None:
    """An int learning rate comes back as the same value, a float (what the optimizer is given)."""
    got = check_learning_rate(lr)
    assert got == want and type(got) is float


@pytest.mark.parametrize("lr", [0, 0.0, -1e-3, math.nan, math.inf, -math.inf, True, "0.1", None])
def test_a_learning_rate_that_trains_nothing_is_refused_naming_the_option(lr: Any) -> None:
    """Zero, negatives, nan and infinities train nothing; bools and text are not numbers: one error naming --lr."""
    with pytest.raises(BiasvizError, match="--lr must be a positive number"):
        check_learning_rate(lr)
