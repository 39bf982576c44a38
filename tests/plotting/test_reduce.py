"""Block reduction of long matrices before drawing (:mod:`biasviz.plotting.reduce`): NaN cells ignored inside a
block, a block of NaN cells NaN."""

from __future__ import annotations

import numpy as np
import pytest

from biasviz.plotting.reduce import block_reduce


def test_block_reduce_is_nan_aware() -> None:
    m = np.arange(16, dtype=np.float32).reshape(4, 4)
    m[np.triu_indices(4, 1)] = np.nan
    out = block_reduce(m, 2)
    assert np.isnan(out[0, 1])
    assert out[0, 0] == pytest.approx((0 + 4 + 5) / 3)
    assert out[1, 0] == pytest.approx((8 + 9 + 12 + 13) / 4)
    assert block_reduce(m, 2, "max")[1, 1] == 15
    padded = block_reduce(np.ones((5, 5)), 2)
    assert padded.shape == (3, 3) and not np.isnan(padded).any()
