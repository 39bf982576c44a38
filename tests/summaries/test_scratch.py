"""Working memory kept from one block of rows to the next (:mod:`biasviz.summaries.scratch`)."""

from __future__ import annotations

import torch

from biasviz.summaries.moments import ShiftedSums
from biasviz.summaries.scratch import Scratch
from tests.summaries.test_replay_finish import H


def test_moments_in_scratch_equal_new_ones_and_reuse_its_memory() -> None:
    sums = ShiftedSums()
    for a in range(3):
        sums.add(torch.randn(H, 6, 8, generator=torch.Generator().manual_seed(a)))
    scratch = Scratch()
    first = sums.moments(0, 6, 8, scratch)
    again = sums.moments(2, 4, 5, scratch)
    assert again.data_ptr() == first.data_ptr()
    assert torch.equal(again, sums.moments(2, 4, 5)) and torch.equal(again, torch.stack(sums.rows(2, 4, 5)))
