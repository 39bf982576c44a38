"""Summaries of a bias of the distance alone, from its values f(d) (:mod:`biasviz.summaries.toeplitz`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries import QuantitySummary
from tests.summaries.test_layer import H, T


@pytest.mark.parametrize(("seq_len", "block"), [(37, 1), (37, 4), (37, 10), (64, 8), (5, 5)])
@pytest.mark.parametrize("samples", [1, 3])
def test_a_distance_only_bias_summarised_from_its_t_values(seq_len: int, block: int, samples: int) -> None:
    """The closed form (no cell visited) equals the streamed summary of the full matrix."""
    from biasviz.summaries.toeplitz import toeplitz_summary

    rng = np.random.default_rng(seq_len + block)
    f = np.cumsum(rng.normal(size=(H, seq_len)), axis=-1).astype(np.float32)  # any f(d), not separable
    i, j = np.indices((seq_len, seq_len))
    full = f[:, np.clip(i - j, 0, None)][None]  # (1, H, T, T)
    s = QuantitySummary("bias", 0, heads=H, seq_len=seq_len, block=block, causal=True, mode="shared",
                        device=torch.device("cpu"))  # fmt: skip
    s.begin_batch(samples)
    s.add(0, torch.from_numpy(full))
    s.end_batch()
    want = s.result()
    got = toeplitz_summary(torch.from_numpy(f), seq_len, block, samples)
    np.testing.assert_allclose(got.mean, want.mean, rtol=1e-6, atol=1e-6, equal_nan=True)
    np.testing.assert_array_equal(np.isnan(got.std), np.isnan(want.std))
    np.testing.assert_allclose(got.profile, want.profile, rtol=1e-6, atol=1e-6)
    for name in ("context_dependence", "toeplitz_residual", "separability_residual"):
        np.testing.assert_allclose(got.diagnostics[name], want.diagnostics[name], rtol=1e-6, atol=1e-9,
                                   equal_nan=True)  # fmt: skip
    assert (got.diagnostics["toeplitz_residual"] == 0).all()


@pytest.mark.parametrize(("scheme", "options", "toeplitz"), [
    ("alibi", {}, True), ("kerple-log", {}, True), ("kerple-power", {}, True), ("t5", {}, True),
    ("fox", {"gate": "bias_only"}, True), ("fire", {}, False), ("cable", {}, False), ("fox", {}, False),
])  # fmt: skip
def test_distance_values_are_the_matrix_diagonals(scheme: str, options: dict, toeplitz: bool) -> None:
    """f(d) read off the scheme where its bias is f(i - j) - equal to every cell of the matrix it fills."""
    from biasviz.schemes import get_scheme
    from biasviz.summaries.toeplitz import distance_values

    module = get_scheme(scheme)(H, 24, **options)
    module.reset_parameters()
    f = distance_values(module, T)
    assert (f is not None) == toeplitz
    if f is not None:
        full = module(None, T, T)[0].detach()  # (H, T, T)
        i, j = np.tril_indices(T)
        np.testing.assert_allclose(full[:, i, j].numpy(), f[:, i - j].numpy(), rtol=3e-7, atol=0)
