"""Attention written out in eager PyTorch (q.kᵀ scaled, + a bias, masked, softmax) kept by a summary's forward
(:func:`~biasviz.tracing.eager.eager_operands`, ``Trace(keep=...)``): the operands it hands over form the model's own
scores; a call that is more than that (softcapping) or formed in a lower precision is streamed, as before. (Such calls
summarised, against float64 math: tests/extraction/test_summary_added_bias.py, written "eager".)

The reference is float64 numpy on the q, k, scale, bias and mask caught at the SDPA call of the same model written
with SDPA (tests/extraction/test_summary_added_bias.py's), whose weights the eager one shares."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from biasviz.tracing import Trace
from biasviz.tracing.eager import eager_operands
from tests.extraction.one_layer import WIDTH, both_ways
from tests.extraction.test_summary_added_bias import Alibi
from tests.summaries.test_sample_cells import HEADS, VOCAB, T, caught_call

N = 3


class EagerAlibi(Alibi):
    """The SDPA model's q, k, v and float mask, written out: softmax(q.kᵀ / sqrt(d) + mask); ``softcap``: tanh'd
    first; ``dtype``: the scores formed in that precision."""

    def __init__(self, how: str, softcap: bool = False, dtype: torch.dtype = torch.float32) -> None:
        super().__init__(how)
        self.softcap, self.dtype = softcap, dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        b, t = ids.shape
        parts = self.qkv(self.embed(ids)).split(HEADS * WIDTH, -1)
        q, k, v = (z.view(b, t, HEADS, WIDTH).transpose(1, 2).to(self.dtype) for z in parts)
        scores = q @ k.transpose(-1, -2) * WIDTH**-0.5
        if self.softcap:
            scores = 5.0 * torch.tanh(scores / 5.0)
        weights = torch.softmax(scores + self.keep(ids).to(self.dtype), dim=-1)
        return (weights @ v).float().sum()


@pytest.mark.parametrize("model", [EagerAlibi("alibi", softcap=True), EagerAlibi("alibi", dtype=torch.bfloat16)],
                         ids=["softcapped", "bfloat16"])  # fmt: skip
def test_an_eager_call_that_is_more_than_scaled_q_k_plus_a_bias_is_streamed_from_the_start(
        model: EagerAlibi, tmp_path: Any) -> None:  # fmt: skip
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), Trace(model, [], inspect=True) as probe:
        model.eval()(ids[:1])
    assert len(probe.calls) == 1 and not probe.calls[0].forms_again
    got = both_ways(model, ids, tmp_path, 1, T)
    assert got["went_streamed"] and not [w for w in got["said"] if "started again" in w]


def test_the_operands_form_the_model_s_own_scores() -> None:
    """q, k, scale, cells and bias handed over give back the eager scores the model took the softmax of."""
    torch.manual_seed(0)
    model = EagerAlibi("window").eval()
    ids = torch.randint(1, VOCAB, (2, T), generator=torch.Generator().manual_seed(5))
    kept: dict[int, Any] = {}
    with torch.no_grad(), Trace(model, [0], keep=lambda index, ops: kept.setdefault(index, ops)):
        model(ids)
    ops = kept[0]
    call = caught_call(lambda: Alibi.forward(model, ids))
    assert np.array_equal(ops.kept.expand(2, HEADS, T, T).numpy(), call["kept"])
    assert ops.scale == pytest.approx(float(call["scale"]))
    formed = ops.scale * (ops.q.double() @ ops.k.double().transpose(-1, -2)) + ops.additive.double()
    want = float(call["scale"]) * np.einsum("nhid,nhjd->nhij", call["q"], call["k"]) + call["added"]
    np.testing.assert_allclose(np.where(call["kept"], formed.numpy(), 0), np.where(call["kept"], want, 0), atol=1e-5)
    assert eager_operands(torch.zeros(2, 3, 4, 4, dtype=torch.float16), _scores_of_two()) is None


def _scores_of_two() -> Any:
    from biasviz.tracing.scores import Scores

    q = torch.zeros(2, 3, 4, 8, dtype=torch.float16)
    return Scores(operands=(q, q.transpose(-1, -2)), lead=(2, 3))
