"""flex_attention calls kept by a summary's forward (:func:`~biasviz.tracing.flex.flex_operands`): a score_mod that
adds a term (ALiBi as attention-gym writes it) and a block mask, formed again from the call's q and k and the one bias
kept, not streamed whole; a score_mod that is not additive (softcapping) is streamed, as before.

The reference is float64 numpy on the q, k, scale, bias and mask caught at the SDPA call of the same model written
with SDPA (tests/extraction/test_summary_added_bias.py's), whose weights the flex one shares."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

from biasviz.tracing import Trace
from tests.extraction.one_layer import WIDTH, assert_as_reference
from tests.extraction.test_summary_added_bias import SLOPES, Alibi, _read, _summary
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

N = 3


class FlexAlibi(Alibi):
    """The SDPA model's q, k, v, attended by flex_attention: ALiBi as a score_mod, -slope_h·(i - j), and the causal
    triangle (``window``: and no key 5 or more back) as a block mask; ``softcap``: 5·tanh(s / 5) instead of ALiBi."""

    def __init__(self, how: str, softcap: bool = False) -> None:
        super().__init__(how)
        self.softcap = softcap

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        b, t = ids.shape
        parts = self.qkv(self.embed(ids)).split(HEADS * WIDTH, -1)
        q, k, v = (z.view(b, t, HEADS, WIDTH).transpose(1, 2) for z in parts)
        slopes = SLOPES[:, 0, 0]
        window = self.how == "window"

        def alibi(score, batch, h, i, j):  # noqa: ANN001, ANN202 - flex's score_mod signature
            return 5.0 * torch.tanh(score / 5.0) if self.softcap else score - slopes[h] * (i - j)

        def causal(batch, h, i, j):  # noqa: ANN001, ANN202 - flex's mask_mod signature
            return (j <= i) & ((i - j < 5) | (not window))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # flex's note that it runs unfused without torch.compile
            out = flex_attention(q, k, v, score_mod=alibi, block_mask=create_block_mask(causal, None, None, t, t,
                                                                                         device="cpu"))  # fmt: skip
        return out.sum()


@pytest.fixture(scope="module", params=[("alibi", 1, T), ("window", N, T // 2)],
                ids=lambda p: f"{p[0]}, batch {p[1]}, R {p[2]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    import biasviz.extraction.summary as summary

    how, batch, resolution = request.param
    torch.manual_seed(0)
    model = FlexAlibi(how).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    call = caught_call(lambda: Alibi.forward(model, ids))  # the same model through SDPA
    tmp = tmp_path_factory.mktemp("flex")
    went = []
    with pytest.MonkeyPatch.context() as patch:
        inner = summary._streamed
        patch.setattr(summary, "_streamed", lambda *a, **k: went.append(1) or inner(*a, **k))
        said = _summary(model, ids, tmp / "again.h5", batch, resolution, streamed=False)
    _summary(model, ids, tmp / "streamed.h5", batch, resolution, streamed=True)
    return {"how": how, "stored": _read(tmp / "again.h5"), "streamed": _read(tmp / "streamed.h5"), "said": said,
            "went_streamed": bool(went), "expected": reference(call, T // resolution, differ=False)}  # fmt: skip


def test_an_additive_score_mod_is_formed_again_and_nothing_is_started_again(summarised: dict[str, Any]) -> None:
    assert not summarised["went_streamed"]
    assert not [w for w in summarised["said"] if "started again" in w], summarised["said"]


@pytest.mark.parametrize("name", [*NAMES, "bias_mean", "bias_std", "bias_profile", "band_mass", "weights_entropy"])
def test_every_quantity_as_float64_math_has_it(summarised: dict[str, Any], name: str) -> None:
    if name == "attended" and summarised["how"] != "window":
        return  # the causal triangle: no mask of its own
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


def test_formed_again_as_the_flex_call_streamed_whole_gives_it(summarised: dict[str, Any]) -> None:
    """Every dataset of the two ways in, P and its diagnostics among them."""
    got, want = summarised["stored"], summarised["streamed"]
    assert got.keys() == want.keys() and "positional_mean" in got
    for name, values in want.items():
        for field in values.dtype.names or [None]:
            a, b = (x if field is None else x[field] for x in (got[name], values))
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True, err_msg=f"{name} {field}")


def test_a_softcapping_score_mod_is_streamed_from_the_start(tmp_path: Any) -> None:
    import biasviz.extraction.summary as summary

    model = FlexAlibi("alibi", softcap=True).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), Trace(model, [], inspect=True) as probe:
        model(ids[:1])
    assert len(probe.calls) == 1 and not probe.calls[0].forms_again
    went = []
    with pytest.MonkeyPatch.context() as patch:
        inner = summary._streamed
        patch.setattr(summary, "_streamed", lambda *a, **k: went.append(1) or inner(*a, **k))
        said = _summary(model, ids, tmp_path / "s.h5", 1, T, streamed=False)
    assert went and not [w for w in said if "started again" in w]
