"""``extract --summary`` through the fused path (:mod:`biasviz.summaries.fused_layer`) against the torch path (rows
formed again block by block), file against file: every dataset of the layer, for models with a bias of distance and
without one, fewer and more than 3 samples, maps of blocks and of cells.

The fused path's accumulators come from the kernels run by Triton's interpreter where Triton is installed, and from
float64 numpy (tests/summaries/fused_reference.py, every cell formed in full) in the tests that take the reference: so
what turns sums into the file is proven apart from the kernels that add them up.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.conftest import small_model
from tests.summaries.fused_reference import accumulators, formed, mlp_cells

T = 32


def _reference_accumulators(q: torch.Tensor, k: torch.Tensor, table: Any, scale: float, block: int,
                            positional: bool, cells: torch.Tensor | None = None, softcap: float | None = None,
                            sinks: torch.Tensor | None = None) -> dict[str, torch.Tensor]:  # fmt: skip
    """The kernels' answer from float64 numpy, from the same q, k, bias (any form of the kernels'), mask, softcap and
    sink logits."""
    from biasviz.summaries.kernels.biases import CellBias, KeyBias, MlpBias, SampleEnds, SampleKeys

    keys = isinstance(table, KeyBias)  # a row of keys g(j): the reference's flag
    table = table.values if keys else table
    qn, kn = q.double().cpu().numpy(), k.double().cpu().numpy()
    t, heads = q.shape[2], q.shape[1]
    if isinstance(table, CellBias):  # (1 or H, T, T), NaN above the diagonal: never read
        tn = np.broadcast_to(np.nan_to_num(table.values.double().cpu().numpy()), (heads, t, t)).copy()
    elif isinstance(table, SampleEnds):  # each sample's own (N, H, T, T), its cells' float32 differences
        e = table.ends.float().cpu()
        tn = np.tril((e[..., :, None] - e[..., None, :]).double().numpy())
    elif isinstance(table, SampleKeys):  # each sample's own row of keys (N, H, T, T), NaN where it attends none
        g = np.nan_to_num(table.values.double().cpu().numpy())
        tn = np.broadcast_to(g[:, :, None, :], (*g.shape[:2], t, t)).copy()
    else:
        tn = (None if table is None else mlp_cells(table, t) if isinstance(table, MlpBias)
              else table.double().cpu().numpy())  # fmt: skip
    cn = None if cells is None else np.stack([np.asarray(cells[a].cpu()) for a in range(len(cells))]) if (
        not torch.is_tensor(cells)) else cells.cpu().numpy()  # each sample's own, one at a time: stacked
    sn = None if sinks is None else sinks.double().cpu().numpy()
    sums = accumulators(qn, kn, tn, scale, block, positional, cn, keys, softcap, sn)
    got = {name: torch.from_numpy(np.ascontiguousarray(x)) for name, x in sums.items()}
    got["lse"] = torch.from_numpy(formed(qn, kn, tn, scale, cn, keys, softcap, sn)[3]).float()
    return got


def _summary(model: torch.nn.Module, ids: np.ndarray, out: Path, resolution: int, mode: str,
             monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, np.ndarray], dict[str, object]]:  # fmt: skip
    monkeypatch.setenv("BIASVIZ_STATISTICS", mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, layers=[1], summary=True, resolution=resolution, device="cpu",
                        progress=False)  # fmt: skip
    with h5py.File(out) as f:
        g = f["layer_1"]
        return {name: g[name][()] for name in g}, dict(g.attrs)


def _compare(fused: dict[str, np.ndarray], torch_path: dict[str, np.ndarray]) -> None:
    assert set(fused) == set(torch_path), set(fused) ^ set(torch_path)
    for name, want in torch_path.items():
        got = fused[name]
        assert got.shape == want.shape and got.dtype == want.dtype, name
        if want.dtype.names:  # records: sink keys (index, share), diagnostics
            for field in want.dtype.names:
                # a diagnostic is a ratio to the spread whose 0 is reached by cancellation (Σ b̄² - |g|² / T of a bias
                # that is exactly s_i - s_j, CABLE's): both paths' zeros are float64 rounding, a few 1e-8
                floor = 1e-6 if name.endswith("diagnostics") else 0.0
                _close(got[field], want[field], f"{name}.{field}", floor=floor)
        elif name == "weights_key_profile":  # a spread: the square root of a difference E[w²] - E[w]², which the torch
            # path forms from float32 squares (a key seen by one query of one sample: sqrt(1e-9), not 0)
            np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5 * _largest(want[0]), err_msg=name)
            np.testing.assert_allclose(got[1], want[1], rtol=1e-3, atol=1e-3 * _largest(want[0]), err_msg=name)
        else:  # an SE is a spread of means: both paths round it as they round the means themselves
            _close(got, want, name, torch_path.get(name.removesuffix("_se")) if name.endswith("_se") else None)


def _largest(x: np.ndarray | None) -> float:
    finite = np.isfinite(x) if x is not None else np.zeros(1, bool)
    return float(np.abs(x[finite]).max()) if finite.any() else 0.0


def _close(got: np.ndarray, want: np.ndarray, name: str, of: np.ndarray | None = None, floor: float = 0.0) -> None:
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want, err_msg=name)
        return
    atol = max(1e-5 * _largest(want), 1e-6 * _largest(of), 1e-8, floor)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=atol, equal_nan=True, err_msg=name)


@pytest.mark.parametrize(("scheme", "samples", "resolution"), [
    ("alibi", 4, 8),  # a bias of distance, standard errors, maps of blocks
    ("kerple-log", 3, T),  # maps of cells: the maps' SEs from the spread, P's from its jackknife
    ("t5", 3, 8),  # a bias by buckets of distance: a table, not a formula
    ("rope", 3, 8),  # no bias: the rotary measures beside
    ("nope", 2, 4),  # two samples: P without an SE
    ("alibi", 1, 8),  # one sample: no spread, no P
    ("fire", 3, 8),  # FIRE's MLP: formed in each tile, its rows past L = 8 interpolated by their own position
    ("cable", 4, 8),  # a bias of each sample's own, e_a(i) - e_a(j): its spread over samples, P's b̄, the jackknife
    ("cable", 3, T),  # ... maps of cells: its SEs from the spread
    ("fox", 2, 4),  # FoX's full gate, the same family: two samples, P without an SE
    ("cable", 1, 8),  # one sample: no spread, no P
])  # fmt: skip
def test_the_fused_path_writes_what_the_torch_path_writes(scheme: str, samples: int, resolution: int,
                                                           tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from biasviz.summaries import kernels

    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", _reference_accumulators, raising=False)
    model = _model(scheme)
    ids = np.random.default_rng(samples).integers(0, 97, size=(samples, T))
    torch_path, torch_attrs = _summary(model, ids, tmp_path / "torch.h5", resolution, "torch", monkeypatch)
    fused, fused_attrs = _summary(model, ids, tmp_path / "fused.h5", resolution, "fused", monkeypatch)
    assert (torch_attrs["statistics"], fused_attrs["statistics"]) == ("torch", "fused")
    _compare(fused, torch_path)


def _model(scheme: str) -> torch.nn.Module:
    """Our small model with 4 heads; FIRE's threshold L at 8 positions, so that rows past it take their own ψ(i)."""
    return small_model(scheme, n_head=4, **({"scheme_options": {"init_threshold": 8.0}} if scheme == "fire" else {}))


@pytest.mark.parametrize("scheme", ["alibi", "fire"])
def test_a_bias_that_differs_from_its_formula_takes_the_torch_path(
    scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """A scheme declared context-free (a function of i - j; FIRE's MLP) whose rows a sample's input changes: measured,
    and left to torch."""
    from biasviz.summaries import kernels

    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", _reference_accumulators, raising=False)
    model = _model(scheme)
    scheme = model.blocks[1].attn.pos_bias
    rows = scheme.rows

    def shifted(x: torch.Tensor | None):  # noqa: ANN202 - the scheme's own rows, moved by the input's first value
        form = rows(x)
        return lambda r0, r1: form(r0, r1) + (0.0 if x is None else 1e-3 * x[..., :1, :1].mean())

    monkeypatch.setattr(scheme, "rows", shifted)
    ids = np.random.default_rng(1).integers(0, 97, size=(3, T))
    _, attrs = _summary(model, ids, tmp_path / "fused.h5", 8, "fused", monkeypatch)
    assert attrs["statistics"] == "torch"


@pytest.mark.parametrize(("scheme", "samples", "resolution"), [("alibi", 3, 8), ("rope", 2, T), ("fire", 3, 8),
                                                              ("cable", 3, 8)])  # fmt: skip
def test_the_kernels_through_the_public_call_write_what_the_torch_path_writes(
    scheme: str, samples: int, resolution: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    """The same, the sums from the kernels themselves, run on the CPU by Triton's interpreter."""
    pytest.importorskip("triton")
    from biasviz.summaries import kernels

    if not kernels.interpreted() and not torch.cuda.is_available():
        pytest.skip("Triton's interpreter was not chosen before Triton was imported")
    model = _model(scheme)
    ids = np.random.default_rng(samples).integers(0, 97, size=(samples, T))
    torch_path, _ = _summary(model, ids, tmp_path / "torch.h5", resolution, "torch", monkeypatch)
    fused, attrs = _summary(model, ids, tmp_path / "fused.h5", resolution, "fused", monkeypatch)
    assert attrs["statistics"] == "fused"
    _compare(fused, torch_path)


def test_the_sums_the_kernels_return_are_what_the_memory_rule_counts() -> None:
    """The fused path leaves a layer to torch where its sums would not fit (fused_layer.sums_bytes): the bound must
    count what the kernels hold, the per-sample block sums that grow with N above all."""
    pytest.importorskip("triton")
    from biasviz.summaries import kernels
    from biasviz.summaries.fused_layer import sums_bytes

    if not kernels.interpreted() and not torch.cuda.is_available():
        pytest.skip("Triton's interpreter was not chosen before Triton was imported")
    from biasviz.summaries.kernels.biases import SampleEnds

    n, heads, t, block = 3, 4, 40, 4
    q, k = torch.randn(n, heads, t, 16), torch.randn(n, heads, t, 16)
    for ends in (None, SampleEnds(-torch.rand(n, heads, t).cumsum(-1))):  # (a bias of each sample's own: K3's sums)
        got = kernels.layer_accumulators(q, k, ends, 0.25, block, positional=True)
        held = sum(x.numel() * x.element_size() for x in got.values())
        held += 0 if ends is None else 4 * (2 * n + 1) * heads * t  # the ends, centred and with their mean
        bound = sums_bytes(n, heads, t, block, own_bias=ends is not None)
        assert 0.9 * bound <= held <= bound


@pytest.mark.parametrize("scheme", ["alibi", "cable"])
@pytest.mark.parametrize(("positional", "measures"), [(False, True), (True, False)])
def test_leaving_p_or_the_measures_out_leaves_them_out_of_both_paths(
    positional: bool, measures: bool, scheme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # fmt: skip
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.summary import extract_summary
    from biasviz.summaries import kernels

    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", _reference_accumulators, raising=False)
    adapter = BiasGPTAdapter(small_model(scheme, n_head=4), source="test")
    ids = np.random.default_rng(9).integers(0, 97, size=(3, T))
    got = {}
    for mode in ("torch", "fused"):
        monkeypatch.setenv("BIASVIZ_STATISTICS", mode)
        extract_summary(adapter, ids, tmp_path / f"{mode}.h5", layers=[1], resolution=8, device="cpu", progress=False,
                        positional=positional, measures=measures)  # fmt: skip
        with h5py.File(tmp_path / f"{mode}.h5") as f:
            got[mode] = {name: f["layer_1"][name][()] for name in f["layer_1"]}
            assert f["layer_1"].attrs["statistics"] == mode
    _compare(got["fused"], got["torch"])
    assert ("positional_mean" in got["fused"]) == positional and ("band_mass" in got["fused"]) == measures


def test_info_says_which_layers_the_kernels_formed_and_trusts_no_other_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    from biasviz.summaries import kernels
    from tests.conftest import run_cli

    monkeypatch.setattr(kernels, "unavailable", lambda device: None)
    monkeypatch.setattr(kernels, "layer_accumulators", _reference_accumulators, raising=False)
    model = small_model("alibi", n_head=4)
    ids = np.random.default_rng(2).integers(0, 97, size=(2, T))
    _summary(model, ids, tmp_path / "fused.h5", 8, "fused", monkeypatch)
    _summary(model, ids, tmp_path / "torch.h5", 8, "torch", monkeypatch)
    said = {mode: run_cli(["info", str(tmp_path / f"{mode}.h5")], capsys)[1] for mode in ("fused", "torch")}
    assert "layer_1 statistics" in said["fused"] and "fused: formed by the GPU kernels" in said["fused"]
    assert "statistics" not in said["torch"]
    with h5py.File(tmp_path / "fused.h5", "r+") as f:
        f["layer_1"].attrs["statistics"] = "fused<script>"
    code, out, _ = run_cli(["info", str(tmp_path / "fused.h5")], capsys)
    assert code == 0 and "statistics" not in out and "<script>" not in out
