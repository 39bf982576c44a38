"""Calls that add a bias in their SDPA float mask (ALiBi, as research code writes it), or the same written out in eager
PyTorch or as a flex_attention score_mod: formed again from the one bias every sample added, kept once, rather than
streamed whole; a bias that depends on the text turns the summary to streaming from the batch that shows it (the
samples before formed again from what they kept), and says so.

The reference is float64 numpy on the q, k, scale, bias and mask caught at the model's own SDPA call (docs/hdf5.md,
'Attended cells'); P, which that reference does not form, is compared with the same call streamed whole."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.extraction.one_layer import (
    OneLayer,
    assert_as_reference,
    assert_same_datasets,
    both_ways,
    positions,
)
from tests.summaries.test_sample_cells import HEADS, NAMES, VOCAB, T, caught_call, reference

N = 3
SLOPES = torch.tensor([2.0 ** (-8 * (h + 1) / HEADS) for h in range(HEADS)])[:, None, None]


class Alibi(OneLayer):
    """ALiBi in the float mask, -slope·(i - j), -inf after the query; ``window``: and beyond 5 keys back;
    ``contextual``: plus a term of each key's token (a bias that depends on the text)."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.key_term = torch.nn.Embedding(VOCAB, HEADS)

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        kept = (j <= i) & ((i - j < 5) if self.how == "window" else True)
        bias = (-SLOPES * (i - j)).masked_fill(~kept, float("-inf"))[None]  # (1, H, T, T)
        if self.how == "contextual":
            bias = bias + 0.3 * self.key_term(ids).permute(0, 2, 1)[:, :, None, :]
        return bias


# the call written as SDPA with a float mask, and the same arithmetic written out in eager PyTorch and as flex_attention
# whose score_mod adds the mask (one batching each)
WAYS = [(how, batch, r, "sdpa") for how in ("alibi", "window", "contextual") for batch, r in ((1, T), (N, T // 2))]
WAYS += [(how, batch, r, written) for written in ("eager", "flex")
         for how, batch, r in (("alibi", 1, T), ("window", N, T // 2), ("contextual", N, T))]  # fmt: skip


@pytest.fixture(scope="module", params=WAYS, ids=lambda p: f"{p[0]}, batch {p[1]}, R {p[2]}, {p[3]}")
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    how, batch, resolution, written = request.param
    torch.manual_seed(0)
    model = Alibi(how).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    call = caught_call(lambda: model(ids))  # the reference: the same q, k and mask through SDPA
    model.written = written
    got = both_ways(model, ids, tmp_path_factory.mktemp("bias"), batch, resolution)
    return {"how": how, **got, "expected": reference(call, T // resolution, differ=False)}


def test_one_bias_is_formed_again_and_one_that_depends_on_the_text_is_streamed(summarised: dict[str, Any]) -> None:
    contextual = summarised["how"] == "contextual"
    assert summarised["went_streamed"] == contextual
    turned = [w for w in summarised["said"] if "streamed as the model forms its rows" in w]
    assert len(turned) == contextual and all("added another bias" in w for w in turned), summarised["said"]
    assert not [w for w in summarised["said"] if "started again" in w], summarised["said"]


@pytest.mark.parametrize("name", [*NAMES, "bias_mean", "bias_std", "bias_profile", "band_mass", "weights_entropy"])
def test_every_quantity_as_float64_math_has_it(summarised: dict[str, Any], name: str) -> None:
    if name == "attended" and summarised["how"] != "window":
        return  # the causal triangle: no mask of its own
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-5, 1e-5)


@pytest.mark.parametrize("name", ["weights_profile_se", "scores_profile_se", "weights_mean_se", "bias_mean_se"])
def test_standard_errors_as_float64_math_has_them(summarised: dict[str, Any], name: str) -> None:
    assert_as_reference(summarised["stored"][name], summarised["expected"][name], name, 2e-4, 1e-5)


def test_formed_again_as_the_call_streamed_whole_gives_it(summarised: dict[str, Any]) -> None:
    """Every dataset of the two ways in, P and its diagnostics among them."""
    assert "positional_mean" in summarised["stored"]
    assert_same_datasets(summarised["stored"], summarised["streamed"])


class DiagonalHidden(Alibi):
    """ALiBi, and a text holding token 1 hides each query's own key, where ALiBi adds 0: the same bias over the cells
    each sample attends, but other cells."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        i, j = positions(ids.shape[1])
        hidden = (ids == 1).any(-1)[:, None, None, None] & (i == j) & (i > 0)  # (B, 1, T, T)
        return super().keep(ids).masked_fill(hidden, float("-inf"))


class LeftPadded(Alibi):
    """ALiBi, and each text's leading 0 tokens (its left padding) are keys no query attends, -inf in the float mask
    as transformers writes padding beside a bias: the first text padded most, so that its cells show only part of the
    bias and the later ones the rest."""

    def keep(self, ids: torch.Tensor) -> torch.Tensor:
        padded = (ids == 0).cumprod(-1).bool()[:, None, None, :]  # (B, 1, 1, T): the leading zeros
        return super().keep(ids).masked_fill(padded, float("-inf"))


@pytest.mark.parametrize("model, batch", [(m, b) for m in ("diagonal", "left padded") for b in (1, N)])
def test_a_bias_beside_samples_masked_differently_is_formed_again_over_each_one_s_cells(
        model: str, batch: int, tmp_path: Any) -> None:  # fmt: skip

    torch.manual_seed(0)
    layer = DiagonalHidden("alibi").eval() if model == "diagonal" else LeftPadded("alibi").eval()
    ids = torch.randint(2, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    if model == "diagonal":
        ids[2, 3] = 1
    else:
        ids[0, :5], ids[2, :2] = 0, 0
    call = caught_call(lambda: layer(ids))
    got = both_ways(layer, ids, tmp_path, batch, T)
    assert not got["went_streamed"] and not [w for w in got["said"] if "started again" in w], got["said"]
    expected, stored = reference(call, 1), got["stored"]
    for name in (*NAMES, "bias_mean", "bias_std", "bias_profile", "band_mass", "weights_entropy", "bias_mean_se",
                 "weights_mean_se"):  # fmt: skip
        assert_as_reference(stored[name], expected[name], name, 2e-4 if name.endswith("_se") else 2e-5, 1e-5)
    assert_same_datasets(stored, got["streamed"])
