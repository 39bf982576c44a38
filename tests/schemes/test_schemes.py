"""Every scheme against its definition (the papers; README's scheme table), computed independently."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.t5.modeling_t5 import T5Attention

from biasviz.common.errors import BiasvizError
from biasviz.model.modeling import attention_pattern
from biasviz.schemes import SCHEMES, all_names, canonical_name, get_scheme
from biasviz.schemes.alibi import ALiBi
from biasviz.schemes.t5 import causal_bucket

H = 12
T = 40
REFERENCE = Path(__file__).resolve().parents[1] / "data" / "alibi_worked_example.json"  # from the ALiBi chapter


def causal_distance(t: int) -> np.ndarray:
    i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    return (i - j).astype(np.float64)


def causal_cells(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))


def scheme_bias(name: str, x: torch.Tensor | None = None, t: int = T, **options: object) -> np.ndarray:
    torch.manual_seed(0)
    scheme = get_scheme(name)(H, 48, **options)
    with torch.no_grad():
        return scheme(x, t, t).double().numpy()


# --- registry ---------------------------------------------------------------------------------


def test_registry_holds_every_scheme_of_the_spec() -> None:
    assert list(SCHEMES) == ["alibi", "kerple-log", "kerple-power", "fire", "t5", "cable", "fox", "rope", "learned",
                             "nope"]  # fmt: skip
    assert canonical_name("kerple") == "kerple-log"
    assert canonical_name("T5-Bias") == "t5"
    assert set(all_names()) >= {"kerple", "t5-bias"}
    assert [n for n, c in SCHEMES.items() if c.context_dependent] == ["cable", "fox"]
    assert [n for n, c in SCHEMES.items() if not c.adds_bias] == ["rope", "learned", "nope"]
    assert [n for n, c in SCHEMES.items() if c.rotary] == ["rope"]


def test_unknown_scheme_lists_the_valid_ones() -> None:
    with pytest.raises(BiasvizError, match="valid schemes: .*alibi.*t5-bias"):
        canonical_name("xpos")


# --- ALiBi ------------------------------------------------------------------------------------


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


# --- T5 ---------------------------------------------------------------------------------------


def test_t5_buckets_equal_transformers() -> None:
    d = torch.arange(0, 5000)
    theirs = T5Attention._relative_position_bucket(-d, bidirectional=False, num_buckets=32, max_distance=128)
    assert torch.equal(causal_bucket(d, 32, 128), theirs)
    d2 = torch.arange(0, 600)
    theirs2 = T5Attention._relative_position_bucket(-d2, bidirectional=False, num_buckets=16, max_distance=64)
    assert torch.equal(causal_bucket(d2, 16, 64), theirs2)


def test_t5_bias_reads_the_table_by_bucket() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("t5")(H, 48)
    with torch.no_grad():
        b = scheme(None, T, T)[0].numpy()
    table = scheme.table.weight.detach().numpy()  # (32, H)
    d = torch.from_numpy(causal_distance(T)).long()
    buckets = T5Attention._relative_position_bucket(-d, bidirectional=False, num_buckets=32, max_distance=128).numpy()
    mask = causal_cells(T)
    for h in range(H):
        np.testing.assert_array_equal(b[h][mask], table[buckets, h][mask])


# --- KERPLE -----------------------------------------------------------------------------------


def test_kerple_log_form() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("kerple-log")(H, 48)
    with torch.no_grad():
        scheme.r1.copy_(torch.linspace(0.005, 3.0, H))  # first head below the 0.01 floor
        scheme.r2.copy_(torch.linspace(2.0, 0.001, H))
        b = scheme(None, T, T)[0].double().numpy()
    r1 = np.maximum(np.linspace(0.005, 3.0, H), 0.01)
    r2 = np.maximum(np.linspace(2.0, 0.001, H), 0.01)
    d = np.clip(causal_distance(T), 0, None)
    mask = causal_cells(T)
    for h in range(H):
        np.testing.assert_allclose(b[h][mask], (-r1[h] * np.log(1 + r2[h] * d))[mask], rtol=1e-5, atol=1e-6)


def test_kerple_power_form_and_range() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("kerple-power")(H, 48)
    with torch.no_grad():
        scheme.r1.copy_(torch.linspace(0.001, 2.0, H))
        scheme.r2.copy_(torch.linspace(0.0, 3.0, H))  # outside (0, 2] at both ends
        b = scheme(None, T, T)[0].double().numpy()
    r1 = np.maximum(np.linspace(0.001, 2.0, H), 0.01)
    r2 = np.clip(np.linspace(0.0, 3.0, H), 0.01, 2.0)
    d = np.clip(causal_distance(T), 0, None)
    mask = causal_cells(T)
    for h in range(H):
        np.testing.assert_allclose(b[h][mask], (-r1[h] * d ** r2[h])[mask], rtol=1e-5, atol=1e-6)


def test_kerple_power_has_finite_gradients_at_distance_zero() -> None:
    scheme = get_scheme("kerple-power")(H, 48)
    scheme(None, 8, 8).sum().backward()
    assert torch.isfinite(scheme.r1.grad).all() and torch.isfinite(scheme.r2.grad).all()


# --- FIRE -------------------------------------------------------------------------------------


def _fire_reference(scheme: torch.nn.Module, t: int) -> np.ndarray:
    c = float(scheme.c.detach())
    big_l = float(scheme.threshold.detach())
    d = np.clip(causal_distance(t), 0, None)
    i = np.arange(t, dtype=np.float64)[:, None]
    u = np.log(c * d + 1) / np.log(c * np.maximum(big_l, i) + 1)  # (T, T) in [0, 1]
    w1, b1 = scheme.mlp[0].weight.detach().double().numpy(), scheme.mlp[0].bias.detach().double().numpy()
    w2, b2 = scheme.mlp[2].weight.detach().double().numpy(), scheme.mlp[2].bias.detach().double().numpy()
    hidden = np.maximum(u[..., None] * w1[:, 0] + b1, 0)  # (T, T, hidden)
    return np.moveaxis(hidden @ w2.T + b2, -1, 0)  # (H, T, T)


@pytest.mark.parametrize("threshold", [512.0, 10.0])
def test_fire_is_mlp_of_progressive_interpolation(threshold: float) -> None:
    torch.manual_seed(0)
    scheme = get_scheme("fire")(H, 48, init_threshold=threshold)
    with torch.no_grad():
        b = scheme(None, T, T)[0].double().numpy()
    mask = causal_cells(T)
    expected = _fire_reference(scheme, T)
    for h in range(H):
        np.testing.assert_allclose(b[h][mask], expected[h][mask], rtol=1e-5, atol=1e-6)


def test_fire_diagonal_is_constant_and_input_in_unit_interval() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("fire")(H, 48, init_threshold=8.0)
    with torch.no_grad():
        b = scheme(None, 64, 64)[0].numpy()
        u = scheme.normalized_distance(64, 64).numpy()
    diag = np.stack([np.diag(b[h]) for h in range(H)])
    np.testing.assert_allclose(diag, diag[:, :1].repeat(64, axis=1), rtol=0, atol=1e-6)
    assert u[causal_cells(64)].min() >= 0 and u[causal_cells(64)].max() <= 1 + 1e-6
    # past the threshold the last row spans the whole unit interval: psi(i) / psi(i) = 1 at j = 0
    assert u[63, 0] == pytest.approx(1.0)


# --- CABLE ------------------------------------------------------------------------------------


def test_cable_equals_sum_of_softplus_costs_between_keys_and_query() -> None:
    torch.manual_seed(0)
    scheme = get_scheme("cable")(H, 48)
    torch.nn.init.normal_(scheme.proj.weight, std=0.3)
    torch.nn.init.normal_(scheme.proj.bias, std=0.3)
    x = torch.randn(2, 16, 48)
    with torch.no_grad():
        b = scheme(x, 16, 16).double().numpy()  # (B, H, T, T)
    w = scheme.proj.weight.detach().double().numpy()
    beta = scheme.proj.bias.detach().double().numpy()
    rates = np.log1p(np.exp(x.double().numpy() @ w.T + beta))  # softplus, (B, T, H)
    for bi in range(2):
        for i in range(16):
            for j in range(i + 1):
                expected = -rates[bi, j + 1 : i + 1].sum(axis=0)  # sum over k = j+1..i
                np.testing.assert_allclose(b[bi, :, i, j], expected, rtol=1e-5, atol=1e-5)


def test_cable_is_path_additive_and_input_dependent() -> None:
    torch.manual_seed(1)
    scheme = get_scheme("cable")(H, 48)
    torch.nn.init.normal_(scheme.proj.weight, std=0.3)
    x = torch.randn(2, 24, 48)
    with torch.no_grad():
        b = scheme(x, 24, 24).double().numpy()
    for i, k, j in [(23, 10, 0), (15, 15, 3), (9, 4, 4), (20, 7, 6)]:
        np.testing.assert_allclose(b[:, :, i, j], b[:, :, i, k] + b[:, :, k, j], rtol=1e-6, atol=1e-5)
    mask = causal_cells(24) & ~np.eye(24, dtype=bool)
    assert np.abs(b[0][:, mask] - b[1][:, mask]).max() > 1e-2  # two inputs, two different biases
    assert (b[:, :, mask] < 0).all()  # softplus > 0: every off-diagonal causal cell is a penalty


def test_cable_needs_the_input() -> None:
    with pytest.raises(BiasvizError, match="depends on the input"):
        get_scheme("cable")(H, 48)(None, 4, 4)


def test_context_independent_schemes_ignore_the_input() -> None:
    for name, cls in SCHEMES.items():
        if not cls.adds_bias or cls.context_dependent:
            continue
        a = scheme_bias(name, torch.randn(1, T, 48))
        b = scheme_bias(name, torch.randn(1, T, 48))
        np.testing.assert_array_equal(a, b)
        assert a.shape == (1, H, T, T), name


def test_unknown_option_is_refused() -> None:
    with pytest.raises(BiasvizError, match="unknown option"):
        get_scheme("t5")(H, 48, buckets=7)


def test_doc_constants() -> None:
    assert math.isclose(2 ** (-8 / 12), 0.6299605249474366)


def test_the_table_and_the_classes_agree() -> None:
    """Each table entry names a class that exists, calls itself by that name, and carries the entry's facts."""
    from biasviz.schemes.registry import TABLE

    for entry in TABLE:
        cls = get_scheme(entry.name)
        assert cls.__name__ == entry.cls and cls.name == entry.name
        assert (cls.aliases, cls.formula, cls.reference) == (entry.aliases, entry.formula, entry.reference)
        flags = ("context_dependent", "adds_bias", "absolute_positions")
        assert [getattr(cls, f) for f in flags] == [getattr(entry, f) for f in flags]
        module = cls(H, 48)
        assert module.options == entry.default_options  # the options the class accepts are the table's
        for alias in entry.aliases:
            assert get_scheme(alias) is cls


def test_the_table_is_readable_without_torch() -> None:
    import subprocess
    import sys

    code = ("import sys; from biasviz.schemes import TABLE, canonical_name, info; "
            "assert canonical_name('kerple') == 'kerple-log' and info('cable').context_dependent; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.log1p(np.exp(-z))


def test_fox_is_the_sum_of_log_forget_gates_between_j_and_i() -> None:
    t, c = 9, 48
    scheme = get_scheme("fox")(H, c)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        scheme.proj.weight.copy_(torch.randn(H, c, generator=g) * 0.3)
        scheme.proj.bias.copy_(torch.randn(H, generator=g))
    x = torch.randn(2, t, c, generator=g)
    got = scheme(x, t, t).detach().double().numpy()  # (B, H, T, T)
    z = x.double().numpy() @ scheme.proj.weight.double().detach().numpy().T + scheme.proj.bias.double().detach().numpy()
    for b in range(2):
        for h in range(H):
            for i in range(t):
                for j in range(i + 1):  # sum over k = j+1 .. i, straight from the definition
                    want = sum(_log_sigmoid(z[b, k, h]) for k in range(j + 1, i + 1))
                    assert got[b, h, i, j] == pytest.approx(want, abs=1e-5)
    cable = get_scheme("cable")(H, c)  # the same family: -softplus(z) = log sigmoid(-z)
    with torch.no_grad():
        cable.proj.weight.copy_(-scheme.proj.weight)
        cable.proj.bias.copy_(-scheme.proj.bias)
    np.testing.assert_allclose(cable(x, t, t).detach().numpy(), got, atol=1e-5)


def test_fox_bias_only_gate_is_an_alibi_and_fixed_follows_the_decay_times() -> None:
    t = 16
    only = get_scheme("fox")(H, 48, gate="bias_only")
    with torch.no_grad():
        only.gate_bias.copy_(torch.linspace(-1.0, 4.0, H))
    slopes = -_log_sigmoid(np.linspace(-1.0, 4.0, H))
    i, j = np.meshgrid(np.arange(t), np.arange(t), indexing="ij")
    want = -slopes[:, None, None] * (i - j)
    cells = j <= i
    np.testing.assert_allclose(only(None, t, t)[0].detach().numpy()[:, cells], want[:, cells], rtol=1e-5, atol=1e-5)
    assert not only.depends_on_input and get_scheme("fox")(H, 48).depends_on_input
    fixed = get_scheme("fox")(H, 48, gate="fixed", decay_time_min=2.0, decay_time_max=512.0)
    times = -1.0 / _log_sigmoid(fixed.gate_bias.double().detach().numpy())
    np.testing.assert_allclose(times, np.geomspace(2.0, 512.0, H), rtol=1e-5)  # float32 parameters
    assert not any(p.requires_grad for p in fixed.parameters())  # fixed: nothing to learn
    with pytest.raises(BiasvizError, match="needs decay_time_min"):
        get_scheme("fox")(H, 48, gate="fixed")
    with pytest.raises(BiasvizError, match="unknown FoX gate"):
        get_scheme("fox")(H, 48, gate="sometimes")


# --- rows: the bias one block of query rows at a time ------------------------------------------------------------
ROW_CASES = [(name, {}) for name, cls in SCHEMES.items() if cls.adds_bias] + [
    ("fox", {"gate": "bias_only", "decay_time_min": 2.0, "decay_time_max": 64.0}),
    ("fox", {"gate": "fixed", "decay_time_min": 2.0, "decay_time_max": 64.0}),
]


def _row_blocks(t: int) -> list[tuple[int, int]]:
    """Blocks of 1, 2, 3, ... rows, then whatever is left: sizes vary and the last is uneven."""
    blocks, r0, rows = [], 0, 1
    while r0 < t:
        blocks.append((r0, min(t, r0 + rows)))
        r0, rows = blocks[-1][1], rows + 1
    return blocks


@pytest.mark.parametrize(("name", "options"), ROW_CASES, ids=lambda v: v if isinstance(v, str) else "-".join(
    str(x) for x in v.values()))  # fmt: skip
@pytest.mark.parametrize("t", [5, 37, 300])
def test_rows_are_the_slices_of_the_full_bias(name: str, options: dict, t: int) -> None:
    torch.manual_seed(0)
    scheme = get_scheme(name)(H, 48, **options)
    with torch.no_grad():
        for p in scheme.parameters():  # away from the initial values, which may be round numbers
            p.add_(torch.rand_like(p) * 0.1)
        scheme.constrain_()
        x = torch.randn(2, t, 48)
        full = scheme.bias(x, t, t)  # (1 or B, H, T, T)
        rows = scheme.rows(x)
        for r0, r1 in _row_blocks(t):
            block = rows(r0, r1)
            assert block.shape == (full.shape[0], H, r1 - r0, r1)
            want = full[:, :, r0:r1, :r1]
            if name == "kerple-power":  # pow rounds differently in its SIMD body and scalar tail: 1 ulp
                torch.testing.assert_close(block, want, rtol=2.4e-7, atol=0)
            else:
                assert torch.equal(block, want)
            block.fill_(0.0)  # each call returns a new tensor: the attention may overwrite it
        assert torch.equal(rows(0, t), full) or name == "kerple-power"


@pytest.mark.parametrize(("name", "options"), [("cable", {}), ("fox", {})])
def test_context_dependent_rows_sum_over_the_input_once_per_forward(name: str, options: dict) -> None:
    scheme = get_scheme(name)(H, 48, **options)
    calls = []
    scheme.proj.register_forward_hook(lambda *_: calls.append(1))
    x = torch.randn(1, 200, 48)
    with torch.no_grad():
        rows = scheme.rows(x)
        for r0, r1 in _row_blocks(200):
            rows(r0, r1)
    assert len(calls) == 1  # not once per block: that would cost O(T^2 C)
    with pytest.raises(BiasvizError, match="needs the attention input"):
        scheme.rows(None)
