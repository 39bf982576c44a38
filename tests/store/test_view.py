"""``biasviz.open``: every file kind reads, labelled, as h5py reads the same cells; ``to_xarray`` takes its
dimensions and coordinates from the HDF5 dimension scales; ``repr`` is ``biasviz info``; ``explore`` is
``biasviz.explore``. Expected values come from h5py alone, never from the view."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.common.errors import BiasvizError
from tests.conftest import run_cli, small_model
from tests.summary_files import cable, weights_of, write_summary

KINDS = ["full", "shared", "summary", "sweep", "summary-sweep"]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Files of every kind: written by biasviz (full with scores, shared bias, summary, full sweep) and by h5py
    alone (a summary sweep)."""
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.run import extract
    from biasviz.extraction.summary import extract_summary
    from tests.explorer.test_build import STEPS, write_sweep

    d = tmp_path_factory.mktemp("open")
    ids = np.random.default_rng(0).integers(0, 97, size=(3, 24))
    cable_model = BiasGPTAdapter(small_model("cable"), source="t")
    extract(cable_model, ids, d / "full.h5", layers="all", device="cpu", progress=False,
            capture=("bias", "weights", "scores"))  # fmt: skip
    extract(BiasGPTAdapter(small_model("alibi"), source="t"), ids, d / "shared.h5", device="cpu", progress=False)
    extract_summary(cable_model, ids, d / "summary.h5", layers=[1], resolution=8, device="cpu", progress=False)
    write_sweep(d / "sweep.h5")
    bias = cable(3, 4, 12)
    write_summary(d / "summary-sweep.h5", bias=bias, weights=weights_of(bias), resolution=4, steps=[0, 10])
    assert STEPS == [0, 50, 200]
    with h5py.File(d / "shared.h5") as f:
        assert f.attrs["bias_shared"] and f["layer_1/bias"].shape[0] == 1  # the bias stored once
    return {k: d / f"{k}.h5" for k in KINDS}


@pytest.fixture(scope="module")
def views(files: dict[str, Path]) -> Iterator[dict[str, Any]]:
    """Each file opened once (opening checks a file in a child process first, as the commands do)."""
    opened = {k: biasviz.open(p) for k, p in files.items()}
    yield opened
    for view in opened.values():
        view.close()


def h5_read(f: h5py.File, name: str) -> np.ndarray:
    """A dataset as h5py reads it, a shared bias repeated over the samples (docs/hdf5.md, 'Summary files')."""
    data = f[name][()]
    if name.endswith("/bias") and f.attrs.get("bias_shared", False):
        data = np.repeat(data, f["input_ids"].shape[0], axis=-4)
    return data


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    if want.dtype.names:
        assert got.dtype.names == want.dtype.names
        for field in want.dtype.names:
            np.testing.assert_array_equal(got[field], want[field].astype(np.float64))
        return
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.asarray(got, np.float64), want.astype(np.float64))  # NaN equals NaN


@pytest.mark.parametrize("kind", KINDS)
def test_every_dataset_reads_as_h5py_reads_it(kind: str, files: dict[str, Path], views: dict[str, Any]) -> None:
    with h5py.File(files[kind]) as f:
        view = views[kind]
        layers = [int(x) for x in f.attrs["layers"]]
        held = {"input_ids", *(f"layer_{layer}/{name}" for layer in layers for name in f[f"layer_{layer}"])}
        assert set(view.keys()) == held
        for name in held:
            assert_same(view[name], h5_read(f, name))
        assert view.layers == layers
        assert view.samples == list(range(f["input_ids"].shape[0]))
        assert view.steps == (list(f["checkpoint"][()]) if "checkpoint" in f else None)
        assert view.kind == ("summary" if f.attrs.get("summary", False) else "full")
        if "head" in f:
            assert view.heads == list(f["head"][()])
    with pytest.raises(KeyError, match="layer_7/bias"):
        views[kind]["layer_7/bias"]


def test_labelled_access_picks_the_cells_h5py_finds_there(files: dict[str, Path], views: dict[str, Any]) -> None:
    with h5py.File(files["full"]) as f:
        view = views["full"]
        assert_same(view.bias(layer=0, sample=1, head=3), f["layer_0/bias"][1, 2])
        assert_same(view.scores(sample=2), f["layer_1/scores"][2])  # layer -1: the last stored
        assert_same(view.weights(layer=1, head=12), f["layer_1/weights"][:, 11])
        assert_same(view.weights(layer=0, sample="mean"), f["layer_0/weights"][()].astype(np.float64).mean(0))
        with pytest.raises(BiasvizError, match="heads are numbered 1 to 12"):
            view.bias(head=0)
    with h5py.File(files["shared"]) as f:
        view = views["shared"]
        assert_same(view.bias(sample=2, head=1), f["layer_1/bias"][0, 0])
    with h5py.File(files["sweep"]) as f:
        view = views["sweep"]
        assert view.steps == [0, 50, 200]
        assert_same(view.bias(step=50, sample=1), f["layer_1/bias"][1, 1])
        assert_same(view.weights(head=2), f["layer_1/weights"][:, :, 1])  # every checkpoint, leading axis
        with pytest.raises(BiasvizError, match="steps 0, 50, 200"):
            view.bias(step=7)
    with h5py.File(files["summary"]) as f:
        view = views["summary"]
        assert_same(view.bias(head=5), f["layer_1/bias_mean"][4])
        assert_same(view.scores(sample="mean"), f["layer_1/scores_mean"][()])
        with pytest.raises(BiasvizError, match="summary file"):
            view.bias(sample=0)


@pytest.mark.parametrize("kind", KINDS)
def test_to_xarray_takes_dimensions_and_coordinates_from_the_scales(kind: str, files: dict[str, Path],
                                                                    views: dict[str, Any]) -> None:
    pytest.importorskip("xarray")
    with h5py.File(files[kind]) as f:
        view = views[kind]
        ds = view.to_xarray()
        layer = f"layer_{max(int(x) for x in f.attrs['layers'])}"
        names = [n for n in f[layer] if not f[f"{layer}/{n}"].dtype.names]
        assert names and set(names) <= set(ds.data_vars)
        for name in [*names, "input_ids"]:
            stored = f[name if name == "input_ids" else f"{layer}/{name}"]
            labels = [d.label for d in stored.dims]
            if not any(labels):  # a file that labels none (h5py's own summary-sweep): the format's names
                labels = ["sample", "query"] if name == "input_ids" else [*"x"]
            assert list(ds[name].dims) == labels
            assert_same(ds[name].values, h5_read(f, stored.name.lstrip("/")))
            for dim in stored.dims:
                if len(dim) and dim[0].shape[0] == ds.sizes[dim.label]:
                    scale = dim[0]
                    want = scale.attrs["names"].split(",") if "names" in scale.attrs else list(scale[()])
                    assert list(ds[dim.label].values) == want, dim.label
        if "diagnostics" in f[layer]:
            rec = f[f"{layer}/diagnostics"][()]
            assert_same(ds["diagnostics_toeplitz_residual"].values, rec["toeplitz_residual"])
        assert ds.attrs["scheme"] == f.attrs["scheme"]


def test_to_xarray_of_every_layer_and_selection_by_label(files: dict[str, Path], views: dict[str, Any]) -> None:
    pytest.importorskip("xarray")
    with h5py.File(files["full"]) as f:
        view = views["full"]
        ds = view.to_xarray(layer=None)
        assert list(ds["layer"].values) == [0, 1]
        assert_same(ds["bias"].sel(layer=0, head=4, sample=2).values, f["layer_0/bias"][2, 3])
    with h5py.File(files["sweep"]) as f:
        view = views["sweep"]
        assert_same(view.to_xarray()["weights"].sel(checkpoint=200, head=1).values, f["layer_1/weights"][2, :, 0])


def test_to_xarray_without_xarray_names_the_extra(views: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xarray", None)  # import xarray then fails as it does when not installed
    with pytest.raises(BiasvizError, match=r"biasviz\[xarray\]"):
        views["full"].to_xarray()


@pytest.mark.slow
def test_repr_is_what_biasviz_info_prints(files: dict[str, Path], views: dict[str, Any],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["info", str(files["summary"])], capsys)
    assert code == 0, err
    assert repr(views["summary"]) == out.rstrip("\n")


@pytest.mark.slow
def test_explore_returns_the_page_biasviz_explore_builds(files: dict[str, Path], views: dict[str, Any]) -> None:
    page = views["summary"].explore(kind="bias")
    assert type(page) is type(biasviz.explore(files["summary"], kind="bias"))
    assert page.html == biasviz.explore(files["summary"], kind="bias").html


@pytest.mark.slow
def test_import_and_open_leave_torch_matplotlib_and_xarray_out(files: dict[str, Path]) -> None:
    code = ("import sys, biasviz\nv = biasviz.open(sys.argv[1])\nv.bias(sample=0)\nv['layer_1/weights']\nrepr(v)\n"
            "print(sorted(m for m in ('torch', 'matplotlib', 'xarray', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(files["full"])], capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    assert out.strip() == "[]"
