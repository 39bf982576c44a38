"""ALiBi against its definition (the paper; README's scheme table), computed independently: BLOOM's slopes, the
ALiBi chapter's worked example, and property tests over every head count and length."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from transformers.models.bloom.modeling_bloom import build_alibi_tensor

from biasviz.common.errors import BiasvizError
from biasviz.model.modeling import attention_pattern
from biasviz.schemes.alibi import ALiBi, geometric_slopes, interleaved_slopes
from tests.properties import SETTINGS, heads, lengths, seeds
from tests.schemes.scheme_biases import H, T, _bias, causal_cells, causal_distance, scheme_bias

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "alibi_worked_example.json"  # from the ALiBi chapter


def test_alibi_geometric_slopes_are_2_pow_minus_8h_over_H() -> None:
    slopes = ALiBi(H, 48).slopes.double().numpy()
    expected = np.array([2.0 ** (-8.0 * h / 12) for h in range(1, 13)])
    np.testing.assert_allclose(slopes, expected, rtol=1e-7)
    assert slopes[0] == pytest.approx(2 ** (-2 / 3)) and slopes[-1] == pytest.approx(2**-8)


@pytest.mark.parametrize("n_head", [1, 2, 5, 8, 12, 16, 20, 32])
def test_alibi_interleaved_slopes_equal_bloom(n_head: int) -> None:
    alibi = build_alibi_tensor(torch.ones(1, 3), n_head, torch.float64)  # (H, 1, 3) = m_h * position
    bloom_slopes = alibi[:, 0, 1].numpy()
    ours = ALiBi(n_head, 48, slopes="interleaved").slopes.double().numpy()
    np.testing.assert_allclose(ours, bloom_slopes, rtol=1e-6)


def test_alibi_bias_is_minus_slope_times_distance() -> None:
    b = scheme_bias("alibi")[0]
    d = causal_distance(T)
    for h in range(H):
        m = 2.0 ** (-8.0 * (h + 1) / H)
        np.testing.assert_allclose(b[h][causal_cells(T)], (-m * d)[causal_cells(T)], rtol=1e-6, atol=1e-6)
    # Figure 12 of the CABLE paper: head 1 reaches about -300 at distance 500
    far = scheme_bias("alibi", t=501)[0, 0, 500, 0]
    assert far == pytest.approx(-500 * 2 ** (-2 / 3)) and -320 < far < -300


def test_alibi_explicit_slopes_and_bad_counts() -> None:
    b = scheme_bias("alibi", slopes=[0.5] * H)[0]
    np.testing.assert_allclose(b[3][5, 1], -2.0)
    with pytest.raises(BiasvizError, match="one slope per head"):
        ALiBi(H, 48, slopes=[0.5, 0.25])
    with pytest.raises(BiasvizError, match="unknown ALiBi slope rule"):
        ALiBi(H, 48, slopes="fibonacci")


def test_alibi_worked_example_reproduced_to_four_decimals() -> None:
    ref = json.loads(REFERENCE.read_text())
    q, k, v = (torch.tensor(ref[n], dtype=torch.float64) for n in ("Q", "K", "V"))
    n_tok, n_heads = q.shape[0], len(ref["slopes"])
    dk = q.shape[1] // n_heads
    split = lambda a: a.view(n_tok, n_heads, dk).transpose(0, 1)[None]  # noqa: E731  (1, H, T, dk)
    slopes = torch.tensor(ALiBi.resolve_slopes(ref["slopes"], n_heads), dtype=torch.float64)
    i = torch.arange(n_tok)
    distance = (i[:, None] - i[None, :]).abs().double()  # bidirectional: |i - j|
    bias = (-slopes[:, None, None] * distance)[None]
    weights = attention_pattern(split(q), split(k), bias, masked=None)[0]  # (H, T, T)
    np.testing.assert_array_equal(np.round(weights.double().numpy(), 4), np.array(ref["expected_weights"]))
    out = (weights.double() @ split(v)[0]).transpose(0, 1).reshape(n_tok, -1)
    np.testing.assert_array_equal(np.round(out.numpy(), 4), np.array(ref["expected_output"]))


def test_doc_constants() -> None:
    assert math.isclose(2 ** (-8 / 12), 0.6299605249474366)


@SETTINGS
@given(h=heads, t=lengths, seed=seeds)
def test_alibi_is_minus_slope_times_distance(h: int, t: int, seed: int) -> None:
    out = _bias("alibi", h, t, 1, seed)[0]  # ALiBi has no learned parameters: seed changes nothing
    slopes = np.array([2.0 ** (-8.0 * k / h) for k in range(1, h + 1)])
    d = np.subtract.outer(np.arange(t), np.arange(t))
    np.testing.assert_allclose(out.numpy(), -slopes[:, None, None] * d, rtol=1e-6, atol=1e-6)


@SETTINGS
@given(h=heads)
def test_alibi_slopes_positive_and_decreasing(h: int) -> None:
    geo = np.array(geometric_slopes(h))
    assert (geo > 0).all() and (np.diff(geo) < 0).all() and geo[-1] == pytest.approx(2.0**-8)
    inter = np.array(interleaved_slopes(h))
    p = 2 ** int(np.floor(np.log2(h)))
    assert len(inter) == h and (inter > 0).all() and (np.diff(inter[:p]) < 0).all()
