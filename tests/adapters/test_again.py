"""Rows formed again (:mod:`biasviz.adapters.again`): which adapters can, and that what they form from a forward's bank
is what the forward formed, the bias the scheme's closed form."""

from __future__ import annotations

import math

import torch
from torch import nn

from biasviz.adapters.again import FormsRowsAgain, forms_rows_again
from biasviz.adapters.base import ModelAdapter
from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.adapters.traced import TracedAdapter
from biasviz.extraction.full_matrices import full_matrices
from biasviz.summaries.bank import SampleBank
from tests.adapters.test_adapters import H, T, ids
from tests.conftest import small_model


class _Attend(nn.Module):
    """One causal SDPA call over an embedding, with a float mask (a bias in the call) or without."""

    def __init__(self, float_mask: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.float_mask = nn.Embedding(97, 16), float_mask

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids).view(*input_ids.shape, 2, 8).transpose(1, 2)
        if not self.float_mask:
            return nn.functional.scaled_dot_product_attention(x, x, x, is_causal=True)
        t = input_ids.shape[1]
        i = torch.arange(t)
        mask = torch.where(i[None, :] <= i[:, None], -0.1 * (i[:, None] - i[None, :]), float("-inf"))
        return nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)


def test_which_adapters_form_rows_again() -> None:
    assert forms_rows_again(BiasGPTAdapter(small_model("alibi"), source="t"))
    plain, biased = TracedAdapter(_Attend(False)), TracedAdapter(_Attend(True))
    for adapter in (plain, biased):  # the calls asked for decide: probed, then chosen
        adapter.prepare(ids(1))
        adapter.resolve_layers("all")
    assert forms_rows_again(plain)  # SDPA without a bias: c·q·kᵀ from the call's q and k
    assert isinstance(biased, FormsRowsAgain) and forms_rows_again(biased)  # a bias in the call: the one kept

    class Claims(ModelAdapter):  # says it replays without being one that can
        replays = True

    assert not forms_rows_again(Claims(nn.Linear(1, 1), scheme="alibi", n_layers=1, n_heads=1, source="t"))


def test_rows_formed_again_are_the_forwards_and_the_bias_alibis_closed_form() -> None:
    adapter = BiasGPTAdapter(small_model("alibi"), source="t")
    x = torch.as_tensor(ids(2))
    with full_matrices(adapter, [1]) as got:  # what the forward formed, from its hook points
        adapter.forward(x)
    bank = SampleBank(2, device=torch.device("cpu"))
    try:
        with adapter.keep([1], bank):
            adapter.forward(x)
        # docs/SPEC: the default slopes m_h = 2^(-8h/H), h = 1 .. H (Press et al.'s geometric sequence at any H)
        slopes = torch.tensor([2.0 ** (-8.0 * h / H) for h in range(1, H + 1)], dtype=torch.float64)
        for sample in range(2):
            for r0, r1 in ((0, 5), (5, 17), (17, T)):
                block = adapter.rows_again(1, bank, sample, r0, r1, True)
                assert block.weights.shape == (1, H, r1 - r0, r1)
                torch.testing.assert_close(block.weights[0], got.weights[1][sample, :, r0:r1, :r1], rtol=1e-5,
                                           atol=1e-6)  # fmt: skip
                i = torch.arange(r0, r1, dtype=torch.float64)[:, None]
                want = -slopes[:, None, None] * (i - torch.arange(r1, dtype=torch.float64)[None, :])
                for bias in (block.bias, adapter.bias_again(1, bank, sample, r0, r1)):
                    assert bias is not None
                    torch.testing.assert_close(bias[0].double(), want, rtol=1e-6, atol=1e-6)
        assert adapter.score_scale(1) == 1 / math.sqrt(48 // H)
        assert adapter.key_repeats(1) == 1 and adapter.attended(1) is None  # every key head once; exactly causal
    finally:
        bank.close()


def test_a_traced_call_s_bias_formed_again_is_its_float_mask_and_its_rows_the_forwards() -> None:
    """c·q·kᵀ + b from the bank's q and k and the one bias kept, against what the forward's traced call formed, and the
    bias against the float mask written out here (-0.1·(i - j) over the causal triangle)."""
    adapter = TracedAdapter(_Attend(True))
    x = torch.as_tensor(ids(2))
    adapter.prepare(x.numpy())
    adapter.resolve_layers("all")
    with full_matrices(adapter, [0], want_scores=True) as got:
        adapter.forward(x)
    bank = SampleBank(2, device=torch.device("cpu"))
    try:
        with adapter.keep([0], bank):
            adapter.forward(x)
        for sample in range(2):
            for r0, r1 in ((0, 5), (5, T)):
                block = adapter.rows_again(0, bank, sample, r0, r1, True)
                torch.testing.assert_close(block.weights[0], got.weights[0][sample, :, r0:r1, :r1], rtol=1e-5,
                                           atol=1e-6)  # fmt: skip
                assert block.scores is not None and block.bias is not None
                causal = torch.ones(r1 - r0, r1, dtype=torch.bool).tril(r0)
                torch.testing.assert_close(block.scores[0][:, causal], got.scores[0][sample, :, r0:r1, :r1][:, causal])
                i = torch.arange(r0, r1, dtype=torch.float64)[:, None]
                want = torch.where(causal, -0.1 * (i - torch.arange(r1, dtype=torch.float64)[None, :]), 0.0)
                torch.testing.assert_close(block.bias[0].double(), want.expand(2, -1, -1), rtol=1e-6, atol=1e-6)
    finally:
        bank.close()
