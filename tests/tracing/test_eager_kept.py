"""Attention written out in eager PyTorch (q.kᵀ scaled, + a bias, masked, softmax) kept by a summary's forward
(:func:`~biasviz.tracing.eager.eager_operands`, ``Trace(keep=...)``) and its rows formed again from its q and k, not
streamed whole; a call that is more than that (softcapping) or formed in a lower precision is streamed, as before.

The reference is float64 numpy on the q, k, scale, bias and mask caught at the SDPA call of the same model written
with SDPA (tests/extraction/test_summary_added_bias.py's), whose weights the eager one shares."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from biasviz.tracing import Trace
from biasviz.tracing.eager import eager_operands
from tests.extraction.one_layer import WIDTH, assert_as_reference
from tests.extraction.test_summary_added_bias import Alibi, _read, _summary
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

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


@pytest.fixture(scope="module", params=[("alibi", 1, T), ("window", N, T // 2), ("contextual", 1, T)],
                ids=lambda p: f"{p[0]}, batch {p[1]}, R {p[2]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import biasviz.extraction.summary as summary

    how, batch, resolution = request.param
    torch.manual_seed(0)
    model = EagerAlibi(how).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    call = caught_call(lambda: Alibi.forward(model, ids))  # the same model through SDPA
    tmp = tmp_path_factory.mktemp("eager")
    went = []
    with pytest.MonkeyPatch.context() as patch:
        inner = summary._streamed
        patch.setattr(summary, "_streamed", lambda *a, **k: went.append(1) or inner(*a, **k))
        said = _summary(model, ids, tmp / "again.h5", batch, resolution, streamed=False)
    _summary(model, ids, tmp / "streamed.h5", batch, resolution, streamed=True)
    return {"how": how, "stored": _read(tmp / "again.h5"), "streamed": _read(tmp / "streamed.h5"), "said": said,
            "went_streamed": bool(went), "expected": reference(call, T // resolution, differ=False)}  # fmt: skip


def test_one_bias_is_formed_again_and_one_that_depends_on_the_text_is_streamed(summarised: dict[str, Any]) -> None:
    contextual = summarised["how"] == "contextual"
    assert summarised["went_streamed"] == contextual
    restarted = [w for w in summarised["said"] if "started again" in w]
    assert len(restarted) == contextual and all("added another bias" in w for w in restarted), summarised["said"]


@pytest.mark.parametrize("name", [*NAMES, "bias_mean", "bias_std", "bias_profile", "band_mass", "weights_entropy"])
def test_every_quantity_as_float64_math_has_it(summarised: dict[str, Any], name: str) -> None:
    if name == "attended" and summarised["how"] != "window":
        return  # the causal triangle: no mask of its own
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


def test_formed_again_as_the_eager_call_streamed_whole_gives_it(summarised: dict[str, Any]) -> None:
    """Every dataset of the two ways in, P and its diagnostics among them; streamed, the weights are the model's own
    softmax's."""
    got, want = summarised["stored"], summarised["streamed"]
    assert got.keys() == want.keys() and "positional_mean" in got
    for name, values in want.items():
        for field in values.dtype.names or [None]:
            a, b = (x if field is None else x[field] for x in (got[name], values))
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True, err_msg=f"{name} {field}")


@pytest.mark.parametrize("model", [EagerAlibi("alibi", softcap=True), EagerAlibi("alibi", dtype=torch.bfloat16)],
                         ids=["softcapped", "bfloat16"])  # fmt: skip
def test_an_eager_call_that_is_more_than_scaled_q_k_plus_a_bias_is_streamed_from_the_start(
        model: EagerAlibi, tmp_path: Any) -> None:  # fmt: skip
    import biasviz.extraction.summary as summary

    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), Trace(model, [], inspect=True) as probe:
        model.eval()(ids[:1])
    assert len(probe.calls) == 1 and not probe.calls[0].forms_again
    went = []
    with pytest.MonkeyPatch.context() as patch:
        inner = summary._streamed
        patch.setattr(summary, "_streamed", lambda *a, **k: went.append(1) or inner(*a, **k))
        said = _summary(model, ids, tmp_path / "s.h5", 1, T, streamed=False)
    assert went and not [w for w in said if "started again" in w]


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
