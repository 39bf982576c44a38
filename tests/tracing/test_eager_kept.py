"""Attention written out in eager PyTorch (q.kᵀ scaled, + a bias, masked, softmax) kept by a summary's forward
(:func:`~biasviz.tracing.eager.eager_operands`, ``Trace(keep=...)``): the operands it hands over form the model's own
scores; Gemma 2's softcapping of a plain scale·q·kᵀ is formed again with its cap; a call that is more than that (a cap
beside a bias) or formed in a lower precision is streamed, as before. (Such calls summarised, against float64 math:
tests/extraction/test_summary_added_bias.py, written "eager".)

The reference is float64 numpy on the q, k, scale, bias and mask caught at the SDPA call of the same model written
with SDPA (tests/extraction/test_summary_added_bias.py's), whose weights the eager one shares."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from biasviz.tracing import Trace
from biasviz.tracing.eager_kept import eager_operands
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


def test_gemma2_s_softcapping_is_formed_again_as_the_library_weighs(tmp_path: Any) -> None:
    """transformers' Gemma 2 (eager attention, c·tanh(s / c) of its scores, a small cap so that it matters): its rows
    formed again from q and k with the cap, not streamed; every dataset as the same model streamed gives it, and the
    weights' mean and spread as float64 numpy of the library's own ``output_attentions``."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    from tests.extraction.one_layer import assert_as_reference, assert_same_datasets, both_ways

    config = Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=HEADS, num_key_value_heads=2, head_dim=WIDTH,
                          attn_logit_softcapping=0.5, sliding_window=5)  # fmt: skip
    torch.manual_seed(0)
    model = Gemma2ForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # scores of several units, so that the cap of 0.5 bends them
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(30.0)
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    got = both_ways(model, ids, tmp_path, N, T)  # the last call: layer 1, every key up to the query
    assert not got["went_streamed"] and not [w for w in got["said"] if "started again" in w], got["said"]
    # formed again, the call has its rotary measures (P by rotary pair), as its SDPA twin has; streamed, it had none
    extra = {"positional_frequency", "positional_frequency_se"}
    assert got["stored"].keys() - got["streamed"].keys() == extra
    assert_same_datasets({k: v for k, v in got["stored"].items() if k not in extra}, got["streamed"])
    with torch.no_grad():
        weights = model(ids, output_attentions=True).attentions[-1].double().numpy()  # (N, H, T, T)
    causal = np.tril(np.ones((T, T), bool))
    for name, want in (("weights_mean", weights.mean(0)), ("weights_std", weights.std(0))):
        assert_as_reference(got["stored"][name], np.where(causal, want, np.nan), name, 1e-5, 1e-6)
