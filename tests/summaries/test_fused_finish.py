"""The summary of a bias of each sample's own finished from K3's sums (:func:`biasviz.summaries.fused_finish.
ends_summary`), against the torch path's own reducer fed every sample's cells: the sums come from float64 numpy of
every cell (tests/summaries/fused_reference.py), so what turns them into maps, profile and diagnostics is proven apart
from the kernel that adds them up."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.fused_finish import ends_summary
from biasviz.summaries.kernels.biases import SampleEnds
from biasviz.summaries.layer import QuantitySummary
from tests.summaries.fused_reference import _own_bias


@pytest.mark.parametrize(("samples", "seq_len", "block"), [(3, 24, 4), (4, 20, 6), (2, 16, 1)])
def test_a_bias_of_each_sample_s_own_finishes_as_the_torch_path_summarises_its_cells(samples: int, seq_len: int,
                                                                                      block: int) -> None:  # fmt: skip
    """CABLE's b_a(i, j) = e_a(i) - e_a(j), e_a = -cumsum(softplus): block means of each cell's mean and spread, the
    profile by distance, and the diagnostics (context dependence, Toeplitz and separability residuals)."""
    heads = 2
    rates = torch.nn.functional.softplus(torch.randn(samples, heads, seq_len, generator=torch.Generator().manual_seed(
        seq_len)))  # fmt: skip
    ends = -rates.cumsum(-1)
    cells = (ends[..., :, None] - ends[..., None, :]).double()  # (N, H, T, T)
    used = np.tril(np.ones((seq_len, seq_len), bool))
    acc = {name: torch.from_numpy(np.ascontiguousarray(x)) for name, x in _own_bias(cells.numpy(), used, block).items()}
    got = ends_summary(acc, SampleEnds(ends), samples=samples, seq_len=seq_len, block=block)
    part = QuantitySummary("bias", 0, heads=heads, seq_len=seq_len, block=block, causal=True, mode="joint",
                           device=torch.device("cpu"))  # fmt: skip
    part.begin_batch(samples)
    part.add(0, cells.float())
    part.end_batch()
    want = part.result()
    for name in ("mean", "std", "profile"):
        np.testing.assert_allclose(getattr(got, name), getattr(want, name), rtol=1e-4, atol=1e-5, err_msg=name)
    assert got.diagnostics is not None and want.diagnostics is not None
    for field in want.diagnostics.dtype.names:  # a ratio to the spread: its 0 is reached by cancellation
        np.testing.assert_allclose(got.diagnostics[field], want.diagnostics[field], rtol=1e-4, atol=1e-6,
                                   err_msg=field)  # fmt: skip
    assert float(np.nanmax(got.std)) > 0  # the samples differ
