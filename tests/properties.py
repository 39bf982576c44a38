"""Hypothesis settings and strategies shared by the property tests (tests/schemes, tests/diagnostics): expectations
come from the definitions of the schemes and diagnostics (README), not from the code under test."""

from __future__ import annotations

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=40, deadline=None)

heads = st.integers(1, 16)

lengths = st.integers(1, 64)

batches = st.integers(1, 3)

seeds = st.integers(0, 2**16)


def _causal(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))
