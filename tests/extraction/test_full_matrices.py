"""A full file's matrices (:mod:`biasviz.extraction.full_matrices`): the blocks :meth:`ModelAdapter.stream` sends, laid
together into each layer's whole matrix."""

from __future__ import annotations

import torch

from biasviz.adapters.rows import RowBlock
from biasviz.extraction.full_matrices import FullMatrices
from tests.adapters.test_adapters import H


def test_full_matrices_lay_blocks_of_rows_into_one_matrix_and_keeps_a_whole_one_as_it_is():
    """Blocks of rows r0 .. r1 - 1 against keys 0 .. r1 - 1 (a causal call in blocks): the matrix they come from in
    the cells j <= i, NaN above in the bias and 0 in the weights; a whole matrix is the same tensor."""
    torch.manual_seed(1)
    n = 7
    bias, weights = torch.randn(1, H, n, n), torch.rand(2, H, n, n)
    got = FullMatrices()
    for r0, r1 in ((0, 3), (3, 4), (4, 7)):
        got.place(RowBlock(0, 0, r0, weights[..., r0:r1, :r1], bias=bias[..., r0:r1, :r1], length=n))
    formed = torch.zeros(n, n, dtype=torch.bool)  # the cells some block holds: a block's rows against its keys
    for r0, r1 in ((0, 3), (3, 4), (4, 7)):
        formed[r0:r1, :r1] = True
    assert got.bias[0].shape == (1, H, n, n) and got.weights[0].shape == (2, H, n, n)
    assert torch.equal(got.bias[0][..., formed], bias[..., formed]) and got.bias[0][..., ~formed].isnan().all()
    assert torch.equal(got.weights[0], torch.where(formed, weights, 0.0))
    q, k = torch.randn(2, H, n, 4), torch.randn(2, H, n, 4)
    got.place(RowBlock(1, 0, 0, weights, bias=bias, q=q, k=k, scale=0.5))
    assert got.weights[1] is weights and got.bias[1] is bias and got.operands[1] == (q, k, 0.5)
