"""Additions that can wait (biasviz.summaries.pending): a count kept with one head widens by head part-way through a
hold, and the additions held before it follow, against numpy cell by cell."""

from __future__ import annotations

import numpy as np
import torch

from biasviz.summaries.sample_profiles import SampleProfiles
from tests.summaries.test_sample_profiles import _reference_se


def test_cells_that_differ_by_head_count_by_head() -> None:
    """Rows 0-2 bring no cells (one count for every head), rows 3-5 a window of 2 for head 1: the counts widen by
    head part-way through a hold, and the addition held before follows them."""
    n, h, t = 3, 2, 6
    values = np.random.default_rng(1).normal(size=(n, h, t, t))
    causal = np.tril(np.ones((t, t), bool))
    window = causal & ~np.tril(np.ones((t, t), bool), -2)
    window[:3] = causal[:3]  # rows 0-2 as the first block brings them
    masks = np.stack([causal, window])  # by head
    profiles = SampleProfiles(samples=n, heads=h, seq_len=t, causal=True, device=torch.device("cpu"))
    profiles.hold()
    profiles.add(0, 0, torch.as_tensor(values[..., :3, :3]))
    profiles.add(0, 3, torch.as_tensor(values[..., 3:, :]), torch.as_tensor(masks[None, :, 3:]))
    profiles.commit()
    got = profiles.standard_error()
    assert got is not None
    for head in range(h):
        want = _reference_se(values[:, head : head + 1], np.stack([masks[head]] * n), True)[0]
        np.testing.assert_allclose(got[head].numpy(), want, rtol=1e-10, equal_nan=True)
