"""The finishing of a block of rows (per-cell moments into maps, diagonal sums, measures, key profile) against
numpy float64, fed in uneven chunks as :func:`biasviz.summaries.replay._finish` feeds it, and what it may and
may not change in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries import QuantitySummary
from biasviz.summaries.key_profile import KeyProfile
from biasviz.summaries.scratch import Scratch

H, T = 3, 29
CHUNKS = (0, 3, 4, 11, 12, 20, T)  # uneven row chunks, some across block boundaries


def _chunks() -> list[tuple[int, int]]:
    return list(zip(CHUNKS[:-1], CHUNKS[1:], strict=True))


def _moments(seed: int = 0) -> np.ndarray:
    """(2, H, T, T) float32: a mean with a distance term and a spread, 0 above the diagonal."""
    rng = np.random.default_rng(seed)
    i, j = np.indices((T, T))
    x = np.stack([-0.5 * (i - j) + rng.normal(size=(H, T, T)), rng.random((H, T, T))]).astype(np.float32)
    return np.where(j <= i, x, np.float32(0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_summaries_change_only_what_they_are_given(dtype: torch.dtype) -> None:
    """Not owned: the caller's tensors (a model's own block, a float64 view of kept moments) stay as they were;
    owned: changed in place, with the same result, also with the temporaries in memory kept from block to block."""
    x = torch.from_numpy(_moments(4)).to(dtype)
    x[0][..., torch.triu(torch.ones(T, T, dtype=torch.bool), 1)] = float("-inf")  # a bias above the diagonal
    results = []
    for owned in (False, True):
        s = QuantitySummary("bias", 0, heads=H, seq_len=T, block=4, causal=True, mode="joint",
                            device=torch.device("cpu"))  # fmt: skip
        s.samples = 3
        work = Scratch() if owned else None
        for r0, r1 in _chunks():
            given = x[:, :, r0:r1, :r1].clone()
            s.add_moments(r0, given, owned=owned, scratch=work)
            assert owned or torch.equal(given, x[:, :, r0:r1, :r1])
        results.append(s.result())
    for a, b in zip(*(vars(r).values() for r in results), strict=True):
        np.testing.assert_array_equal(a, b)


def test_key_profile_of_uneven_chunks_equals_numpy() -> None:
    x = _moments(5)
    x[0] = np.abs(x[0])
    keys = KeyProfile(samples=3, heads=H, seq_len=T, block=1, causal=True, device=torch.device("cpu"))
    for r0, r1 in _chunks():
        keys.add_moments(r0, torch.from_numpy(x[:, :, r0:r1, :r1].copy()), None)
    seen = np.arange(T, 0, -1)  # queries i >= j
    mean = x[0].astype(np.float64).sum(1) / seen
    var = (x.astype(np.float64) ** 2).sum((0, 2)) / seen - mean**2
    np.testing.assert_allclose(keys.profile().numpy(), np.stack([mean, np.sqrt(var)]), rtol=1e-5, atol=1e-6)
