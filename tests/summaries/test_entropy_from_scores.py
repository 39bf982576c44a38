"""The weights' entropy from the scores they were formed from (no logarithm per cell) against float64 -Σ w log w."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from biasviz.summaries.weight_measures import entropy_from_scores


def reference(scores: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """-Σ w log w over each row's kept cells, w the float64 softmax of the scores there; 0 for a row with none."""
    z = np.where(kept, scores, -np.inf)
    top = np.where(kept.any(-1, keepdims=True), z.max(-1, keepdims=True), 0.0)
    e = np.where(kept, np.exp(z - top), 0.0)
    w = e / np.maximum(e.sum(-1, keepdims=True), 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(w > 0, w * np.log(w), 0.0).sum(-1)


@pytest.mark.parametrize("spread", [0.01, 1.0, 30.0, 300.0])  # nearly uniform rows to rows of one key
def test_entropy_from_scores_equals_float64_entropy_of_the_softmax(spread: float) -> None:
    g = torch.Generator().manual_seed(int(spread * 100))
    scores = spread * torch.randn(2, 3, 40, 257, generator=g) + 50.0  # far from 0: a shift must not cancel
    kept = torch.rand(2, 3, 40, 257, generator=g) < 0.7
    kept[..., 5, :] = False  # a row that attends nothing
    weights = torch.softmax(scores.masked_fill(~kept, float("-inf")), -1).nan_to_num_(0.0)
    got = entropy_from_scores(weights, scores, torch.empty_like(weights))
    assert got is not None
    want = reference(scores.double().numpy(), kept.numpy())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=2e-5)
    assert (got[..., 5] == 0).all()


def test_scores_masked_to_minus_infinity_give_way_to_the_logarithms() -> None:
    """A score of -inf where the weight is 0 (a mask added to the scores) makes 0 x inf: the caller is told."""
    scores = torch.tensor([[0.5, 1.0, float("-inf")]])
    weights = torch.softmax(scores, -1)
    assert entropy_from_scores(weights, scores, torch.empty_like(weights)) is None
