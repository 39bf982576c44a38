"""The strided-table attention (SDPA with the distance table as its mask, seen through strides) against float64
math and the blocked path.

No compiler is involved, so nothing here skips. The table path is forced (``BIASVIZ_ATTENTION=table``) with blocks
of 128 rows at T = 300, so that a forward spans three blocks, the last one short, and a batch of two windows, one
padded with one token.
"""

from __future__ import annotations

import math

import pytest
import torch

from biasviz.model import fused
from biasviz.schemes import SCHEMES
from tests.model.test_fused_attention import (  # T = 300: several blocks, one padded window
    T,
    layer_and_float64,
    model_of,
    run,
    windows,
)

DISTANCE_SCHEMES = ["alibi", "kerple-log", "kerple-power", "t5"]  # with their default options
FOX_BIAS_ONLY = {"gate": "bias_only"}  # FoX's context-free gate: a table too (its default gate is not)


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch) -> None:
    monkeypatch.setattr(fused, "TABLE_ROWS", 128)


def test_the_distance_schemes_have_a_table() -> None:
    x = torch.zeros(1, 8, 64)
    for scheme in sorted(SCHEMES):
        terms = model_of(scheme).blocks[0].attn.pos_bias
        terms = terms.score_terms(x) if terms is not None and terms.adds_bias else None
        assert (terms is not None and terms.distance is not None) == (scheme in DISTANCE_SCHEMES), scheme


@pytest.mark.parametrize(("scheme", "options"), [(s, {}) for s in DISTANCE_SCHEMES] + [("fox", FOX_BIAS_ONLY)])
def test_table_layer_equals_float64_math(scheme: str, options: dict, monkeypatch) -> None:
    """One layer against softmax(scale q k^T + b) v in float64, b from the scheme's own full ``bias``."""
    monkeypatch.setenv("BIASVIZ_ATTENTION", "table")
    calls: list[int] = []
    real = fused.attend_by_table
    monkeypatch.setattr(fused, "attend_by_table", lambda *a, **k: calls.append(1) or real(*a, **k))
    out, expected = layer_and_float64(model_of(scheme, scheme_options=options).blocks[0].attn)
    assert calls == [1]
    assert (out.double() - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_table_equals_blocked_path(scheme: str, monkeypatch) -> None:
    """Every scheme: with the table forced, logits and the listened layer's blocks equal the blocked path's (schemes
    without a table take the blocked path themselves)."""
    model, ids = model_of(scheme), windows()
    table_logits, table_seen = run(model, ids, "table", monkeypatch)
    sdpa_logits, sdpa_seen = run(model, ids, "sdpa", monkeypatch)
    assert (table_logits - sdpa_logits).abs().max() <= 1e-5 * sdpa_logits.abs().max()
    assert table_seen.keys() == sdpa_seen.keys()
    for name in table_seen:
        torch.testing.assert_close(table_seen[name], sdpa_seen[name], rtol=1e-5, atol=1e-5)


def test_the_mask_is_the_table_seen_through_strides(monkeypatch) -> None:
    """No bias block is written: every mask SDPA receives is a view of one (H, 2T - 1) table, and its cells are
    f(i - j) for the block's rows (in reverse order) with -inf past the diagonal."""
    seen: list[tuple[int, int, int, int]] = []  # (storage, storage bytes, r1, rows)
    real = fused.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append((attn_mask.untyped_storage().data_ptr(), attn_mask.untyped_storage().nbytes(), k.shape[-2],
                     q.shape[-2]))  # fmt: skip
        rows, r1 = q.shape[-2], k.shape[-2]
        i = torch.arange(r1 - 1, r1 - rows - 1, -1)[:, None]  # the block's rows, reversed
        d = i - torch.arange(r1)[None, :]
        expected = torch.where(d >= 0, -slopes[:, None, None] * d, float("-inf"))  # ALiBi with these slopes
        torch.testing.assert_close(attn_mask[0], expected, rtol=0, atol=1e-6 * T)
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(fused.F, "scaled_dot_product_attention", spy)
    H, hd = 4, 16
    slopes = torch.tensor([2.0 ** (-2 * (h + 1)) for h in range(H)])
    d = torch.arange(T - 1, -T, -1).float()  # entry m holds d = T - 1 - m
    table = -slopes[:, None] * d[None, :]
    q, k, v = (torch.randn(1, H, T, hd) for _ in range(3))
    fused.attend_by_table(q, k, v, table, 0.25)
    assert [(r1, rows) for _, _, r1, rows in seen] == [(128, 128), (256, 128), (300, 44)]
    assert len({ptr for ptr, *_ in seen}) == 1 and seen[0][1] == H * (2 * T - 1) * 4


def test_auto_takes_the_table_on_the_cpu(monkeypatch) -> None:
    """Without a listener, ``auto`` sends a distance bias to the table at any length on the CPU, and leaves a bias
    without one (CABLE below flex's length, FIRE) to the blocked path."""
    calls: list[str] = []
    real = fused.attend_by_table
    monkeypatch.setattr(fused, "attend_by_table", lambda *a, **k: calls.append("table") or real(*a, **k))
    monkeypatch.setattr(fused, "attend", lambda *a, **k: calls.append("flex"))
    monkeypatch.setenv("BIASVIZ_ATTENTION", "auto")
    for scheme, expected in [("alibi", 2), ("t5", 2), ("cable", 0), ("fire", 0)]:
        calls.clear()
        with torch.no_grad():
            model_of(scheme)(windows())
        assert calls == ["table"] * expected, scheme


def test_a_trace_sees_the_layer_not_the_table(monkeypatch) -> None:
    """Under ``biasviz.trace`` the layer's SDPA call is the plain one: its bias is the scheme's f(i - j) for rows in
    order (the table's calls would show rows reversed against a strided mask)."""
    import biasviz

    calls: list[int] = []
    real = fused.attend_by_table
    monkeypatch.setattr(fused, "attend_by_table", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setenv("BIASVIZ_ATTENTION", "auto")
    model = model_of("alibi")
    ids = windows()[:1, :40]
    with torch.no_grad(), biasviz.trace() as t:
        model(ids)
    assert calls == []
    want = model.blocks[0].attn.pos_bias.bias(None, 40, 40)  # (1, H, T, T)
    got = t.bias[0]
    masked = torch.ones(40, 40, dtype=torch.bool).triu(1)
    assert torch.isnan(got[..., masked]).all()
    torch.testing.assert_close(got[..., ~masked], want[..., ~masked].float(), rtol=0, atol=1e-6)


def test_far_keys_without_weight_are_left_out(monkeypatch) -> None:
    """Steep slopes (in no order over the heads) make far keys' weights underflow: those entries become -inf only
    where every cell's weight is below exp(-90) in float64, heads that share reach share calls (a run of heads in
    order as a view, others picked out), the calls skip keys no row of theirs weighs, and the output still equals
    float64 math."""
    monkeypatch.setattr(fused, "CALL_CELLS", 0)  # a call costs nothing: heads with other reaches get calls of their own
    H, hd = 6, 16
    gen = torch.Generator().manual_seed(3)
    slopes = torch.tensor([0.9, 0.02, 0.5, 0.7, 0.001, 0.45])
    q, k, v = (0.3 * torch.randn(2, H, T, hd, generator=gen) for _ in range(3))
    d = torch.arange(T - 1, -T, -1).float()  # entry m holds d = T - 1 - m
    table = -slopes[:, None] * d.abs()[None, :]
    cells: list[int] = []  # (head, query, key) cells per call
    real = fused.F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        cells.append(q.shape[1] * q.shape[2] * k.shape[2])
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(fused.F, "scaled_dot_product_attention", spy)
    out = fused.attend_by_table(q, k, v, table, 0.25)
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
    bias = (-slopes[:, None, None].double() * (i - j)).masked_fill(j > i, float("-inf"))
    weights = torch.softmax(0.25 * q.double() @ k.double().transpose(-2, -1) + bias, dim=-1)
    expected = weights @ v.double()
    assert (out.double() - expected).abs().max() <= 1e-6 * expected.abs().max()
    cut = table.clone()
    cut[:, T:] = float("-inf")
    far = fused.negligible(cut, q, k, 0.25)
    assert far[4] == 0 and far[1] == 0 and (far[[0, 2, 3, 5]] > 0).all()
    dropped = (cut[:, :T] == float("-inf")).flip(-1)  # (H, d): distances left out, d = 0 .. T - 1
    for h in range(H):
        at = dropped[h][(i - j).clamp(min=0)] & (j <= i)  # (T, T): the cells of those distances
        assert weights[:, h][:, at].max() < math.exp(-90) if at.any() else True
    groups = fused.head_groups(far.tolist(), T, fused.TABLE_ROWS)
    assert len(groups) > 1 and any(not isinstance(heads, slice) for heads, _ in groups)
    every = sum((r1 - r0) * r1 for r0, r1 in [(0, 128), (128, 256), (256, T)])  # per head, keys 0 .. r1 - 1
    assert sum(cells) < H * every  # blocks of steep heads left their far keys out
