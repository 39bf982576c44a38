"""The attention arithmetic the model's paths share (:mod:`biasviz.model.attention`): the pattern against a softmax
computed independently, the copy-free masked softmax, and the query blocks."""

from __future__ import annotations

import pytest
import torch


def _softmax_reference(q, k, bias, masked, scale):  # noqa: ANN001, ANN202
    """Attention weights computed independently, in float64 with an explicit exp / sum."""
    s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
    if bias is not None:
        s = s + bias.double()
    if masked is not None:
        s = s.masked_fill(masked, float("-inf"))
    e = torch.exp(s - s.max(dim=-1, keepdim=True).values)
    return e / e.sum(dim=-1, keepdim=True)


@pytest.mark.parametrize("bias_batch", [None, 1, 2])
@pytest.mark.parametrize("mask", ["none", "full", "block"])
def test_attention_pattern_equals_reference_softmax(bias_batch: int | None, mask: str) -> None:
    """Whole matrices and causal query blocks (a mask over the trailing square), with and without autograd."""
    from biasviz.model.attention import attention_pattern, causal_mask

    g = torch.Generator().manual_seed(0)
    B, H, T, D = 2, 3, 19, 8
    r0, r1 = (0, T) if mask != "block" else (7, 12)  # the block: queries 7..11 against keys 0..11
    q, k, v = (torch.randn(B, H, T, D, generator=g) for _ in range(3))
    bias = None if bias_batch is None else torch.randn(bias_batch, H, T, T, generator=g)
    full = causal_mask(T, T, torch.device("cpu")) if mask != "none" else None
    want = _softmax_reference(q, k, bias, full, 0.3)[:, :, r0:r1, :r1]  # rows r0..r1-1 never see keys >= r1
    if mask == "block":
        assert (want.sum(-1) - 1).abs().max() < 1e-12  # so the block's keys carry all the weight
    q_blk, k_blk = q[:, :, r0:r1], k[:, :, :r1]
    bias_blk = None if bias is None else bias[:, :, r0:r1, :r1]
    masked = {"none": None, "full": full, "block": causal_mask(r1 - r0, r1 - r0, torch.device("cpu"))}[mask]
    got = attention_pattern(q_blk, k_blk, bias_blk, masked, 0.3)
    assert got.shape == (B, H, r1 - r0, r1) and got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)
    if mask != "none":
        assert (got[..., causal_mask(r1 - r0, r1, torch.device("cpu"))] == 0).all()  # exact zeros past the diagonal
    grad = attention_pattern(q_blk.requires_grad_(), k_blk, bias_blk, masked, 0.3)  # the differentiable formula
    assert grad.requires_grad
    torch.testing.assert_close(grad.detach().double(), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("rows", "keys"), [(1, 1), (5, 5), (5, 19)])
def test_masked_softmax_leaves_the_scores_as_they_were_and_equals_the_in_place_one(rows: int, keys: int) -> None:
    """The copy-free softmax of a block: the reference softmax, bit for bit the in-place one, scores untouched."""
    from biasviz.model.attention import causal_mask, masked_softmax, masked_softmax_

    scores = torch.randn(2, 3, rows, keys, generator=torch.Generator().manual_seed(1)) * 4
    before = scores.clone()
    square = causal_mask(rows, rows, scores.device)
    got = masked_softmax(scores, square)
    assert torch.equal(scores, before)
    assert torch.equal(got, masked_softmax_(before.clone(), square))
    full = torch.zeros(rows, keys, dtype=torch.bool)
    full[:, keys - rows :] = square
    want = torch.softmax(before.double().masked_fill(full, float("-inf")), dim=-1)
    torch.testing.assert_close(got.double(), want, rtol=0, atol=1e-6)


@pytest.mark.parametrize(("q_len", "per_cell", "budget"), [(1, 1, 1), (5, 1, 6), (100, 12, 1), (300, 12, 5000),
                                                            (1000, 24, 1 << 20), (64, 1, 1 << 30)])  # fmt: skip
def test_query_blocks_cover_every_row_within_the_budget(q_len: int, per_cell: int, budget: int) -> None:
    from biasviz.model.attention import query_blocks

    blocks = list(query_blocks(q_len, per_cell, budget))
    assert blocks[0][0] == 0 and blocks[-1][1] == q_len
    assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))  # contiguous, in order
    for r0, r1 in blocks:
        assert r1 > r0  # at least one row, whatever the budget
        assert r1 - r0 == 1 or per_cell * (r1 - r0) * r1 <= budget
