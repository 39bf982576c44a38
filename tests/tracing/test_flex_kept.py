"""flex_attention calls kept by a summary's forward (:func:`~biasviz.tracing.flex.flex_operands`): a score_mod that
adds a term (ALiBi as attention-gym writes it) and a block mask, formed again from the call's q and k and the one bias
kept, not streamed whole; a score_mod that is not additive (softcapping) is streamed, as before. (A score_mod that adds
a float mask, one batching each: tests/extraction/test_summary_added_bias.py, written "flex".)

The reference is float64 numpy on the q, k, scale, bias and mask caught at the SDPA call of the same model written
with SDPA (tests/extraction/test_summary_added_bias.py's), whose weights the flex one shares."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

from biasviz.tracing import Trace
from tests.extraction.one_layer import WIDTH, assert_as_reference, assert_same_datasets, both_ways
from tests.extraction.test_summary_added_bias import SLOPES, Alibi
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


@pytest.mark.parametrize(("rows", "batch"), [(None, N), (3, N), (None, 1)],
                         ids=["every row at once", "3 query rows at a time", "a sample a batch"])
def test_attention_gym_s_alibi_and_a_window_block_mask_are_formed_again_as_float64_math_has_them(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, rows: int | None, batch: int) -> None:  # fmt: skip
    """ALiBi as a score_mod over a sliding-window block mask, 3 samples in one batch, blocks of 2 positions: formed
    again (nothing streamed, nothing started again), every quantity as float64 math on the SDPA twin's call has it, and
    every dataset as the same call streamed whole gives it. The keeping trace evaluates score_mod and the mask a block
    of query rows at a time (``rows``: blocks that do not divide T); ALiBi held as its table of j - i, and (a sample a
    batch) each later batch's table compared with the first's."""
    import biasviz.tracing.flex as flex

    if rows is not None:
        monkeypatch.setattr(flex, "KEEP_CELLS", N * HEADS * T * rows)
    torch.manual_seed(0)
    model = FlexAlibi("window").eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    call = caught_call(lambda: Alibi.forward(model, ids))  # the same model through SDPA
    got = both_ways(model, ids, tmp_path, batch, T // 2)
    assert not got["went_streamed"] and not [w for w in got["said"] if "started again" in w], got["said"]
    expected = reference(call, 2, differ=False)
    for name in (*NAMES, "bias_mean", "bias_std", "bias_profile", "band_mass", "weights_entropy"):
        assert_as_reference(got["stored"][name], expected[name], name, 2e-5, 1e-5)
    assert_same_datasets(got["stored"], got["streamed"])


def test_a_softcapping_score_mod_is_streamed_from_the_start(tmp_path: Any) -> None:
    model = FlexAlibi("alibi", softcap=True).eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), Trace(model, [], inspect=True) as probe:
        model(ids[:1])
    assert len(probe.calls) == 1 and not probe.calls[0].forms_again
    got = both_ways(model, ids, tmp_path, 1, T)
    assert got["went_streamed"] and not [w for w in got["said"] if "started again" in w]


def _operands(score_mod: Any, mask_mod: Any, batch: int = N, heads: int = HEADS, t: int = T) -> Any:
    """What :func:`~biasviz.tracing.flex.flex_operands` makes of a flex_attention call's arguments, as the operator
    receives them (q, k, v, score_mod, the block mask's tuple ending in its mask_mod, the scale, ...)."""
    from biasviz.tracing.flex import flex_operands

    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(batch, heads, t, WIDTH, generator=gen) for _ in range(3))
    return flex_operands((q, k, v, score_mod, (mask_mod,), None, {}, (), ()), {})


I, J = torch.arange(T)[:, None], torch.arange(T)[None, :]
SLOPE = SLOPES[:, 0, 0]
BIASES = {  # name -> (score_mod, the bias as float64 math has it (H, T, T), the form it is kept in, its table's size)
    "alibi": (lambda s, b, h, i, j: s - SLOPE[h] * (i - j), -SLOPE[:, None, None] * (I - J), "offset", 2 * T - 1),
    "m·j": (lambda s, b, h, i, j: s + SLOPE[h] * j, (SLOPE[:, None, None] * J).expand(HEADS, T, T), "key", T),
    "cells": (lambda s, b, h, i, j: s - SLOPE[h] * torch.log1p((i - j).float()) * (1 + i / T),
              -SLOPE[:, None, None] * torch.log1p((I - J).clamp(min=0).float()) * (1 + I / T), None, None),
}  # fmt: skip


@pytest.mark.parametrize("rows", [None, 3], ids=["every row at once", "3 query rows at a time"])
@pytest.mark.parametrize("name", list(BIASES))
def test_a_mask_and_bias_the_same_for_every_sample_are_kept_in_their_smallest_form(
        monkeypatch: pytest.MonkeyPatch, name: str, rows: int | None) -> None:  # fmt: skip
    """A causal mask_mod is kept as one (T, T) mask, not one a sample and head (B·H·T² bytes: 12 GiB a layer at
    T = 32768 with 12 heads). ALiBi's score_mod is kept as a table of j - i a head and BLOOM's m·j as a row of keys,
    (H, 2T - 1) and (H, T) floats, never as H·T² (48 GiB a layer at T = 32768); a bias of neither form (FIRE's
    interpolation written into a score_mod) is evaluated again and kept cell by cell. Each equals float64 math on
    every attended cell."""
    import biasviz.tracing.flex as flex

    if rows is not None:
        monkeypatch.setattr(flex, "KEEP_CELLS", N * HEADS * T * rows)
    score_mod, bias, form, size = BIASES[name]
    ops = _operands(score_mod, lambda b, h, i, j: j <= i)
    assert ops.kept.shape == (1, 1, T, T) and torch.equal(ops.kept[0, 0], J <= I)
    if form is None:
        assert ops.compact is None and ops.additive.shape == (1, HEADS, T, T)
    else:
        assert ops.additive is None and ops.compact.form == form and ops.compact.values.shape == (1, HEADS, size)
    torch.testing.assert_close(torch.where(ops.kept, ops.dense().additive, 0.0), torch.where(J <= I, bias, 0.0)[None])


def test_a_bias_that_reads_the_sample_is_kept_per_sample() -> None:
    """ALiBi whose slope a sample changes: each sample's own, cell by cell (one table for all would be wrong)."""
    ops = _operands(lambda s, b, h, i, j: s - (1 + b) * SLOPE[h] * (i - j), lambda b, h, i, j: j <= i)
    assert ops.compact is None and ops.additive.shape == (N, HEADS, T, T)
    for b in range(N):
        torch.testing.assert_close(torch.where(J <= I, ops.additive[b], 0.0),
                                   torch.where(J <= I, -(1 + b) * SLOPE[:, None, None] * (I - J), 0.0))  # fmt: skip


def test_a_mask_that_reads_the_sample_part_way_is_kept_per_sample_from_its_first_row(
        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A mask_mod that is the same for every sample in the first blocks of rows and not in a later one (sample b
    leaves out key b from row 9 on): the rows before are repeated for every sample, and the whole is the grid's own
    mask, sample by sample."""
    import biasviz.tracing.flex as flex

    monkeypatch.setattr(flex, "KEEP_CELLS", N * HEADS * T * 4)  # 4 rows a block: rows 0 .. 7 the same for all
    ops = _operands(None, lambda b, h, i, j: (j <= i) & ((i < 9) | (j != b)))
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    assert ops.kept.shape == (N, 1, T, T) and ops.additive is None
    for b in range(N):
        assert torch.equal(ops.kept[b, 0], (j <= i) & ((i < 9) | (j != b))), b


class FlexAlibiBySample(FlexAlibi):
    """ALiBi whose slopes a sample's first token doubles (odd) or leaves (even), in a score_mod of one sample a batch:
    each batch's bias is a table of j - i, but not the first batch's."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import flex_attention

        b, t = ids.shape
        parts = self.qkv(self.embed(ids)).split(HEADS * WIDTH, -1)
        q, k, v = (z.view(b, t, HEADS, WIDTH).transpose(1, 2) for z in parts)
        slopes = SLOPES[:, 0, 0] * (1 + ids[0, 0] % 2)

        def alibi(score, batch, h, i, j):  # noqa: ANN001, ANN202 - flex's score_mod signature
            return torch.where(j <= i, score - slopes[h] * (i - j), float("-inf"))

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return flex_attention(q, k, v, score_mod=alibi).sum()


def test_a_later_batch_s_other_table_is_kept_for_its_own_samples(tmp_path: Any) -> None:
    """Samples whose ALiBi tables differ, a sample a batch: the first table is kept, a later one that differs is held
    for its own samples (each sample's table in the bank), and the summary is the one streamed whole."""
    torch.manual_seed(0)
    model = FlexAlibiBySample("alibi").eval()
    ids = torch.randint(1, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    ids[:, 0] = torch.tensor([2, 3, 2])  # the second sample's slopes doubled
    got = both_ways(model, ids, tmp_path, 1, T // 2)
    assert not got["went_streamed"] and not [w for w in got["said"] if "started again" in w], got["said"]
    assert float(got["stored"]["bias_std"][np.isfinite(got["stored"]["bias_std"])].max()) > 0  # it differs
    assert_same_datasets(got["stored"], got["streamed"])
