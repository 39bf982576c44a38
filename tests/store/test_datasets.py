"""One table of a summary layer's datasets (biasviz.store.datasets): every dataset a summary of our own model holds
has a row there, and is stored with the row's dimensions, shape and type; a sweep joined from such files adds the
checkpoint axis in front; the validator refuses a dataset of the wrong shape, the older datasets of docs/hdf5.md
('Summary files') and docs/positional.md as well as the measures of docs/position-measures.md."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.common.errors import BiasvizError
from biasviz.store.datasets import (
    KEY_PROFILE,
    POSITIONAL_PROFILE,
    ROWS,
    SINK_SHARE,
    dimension_sizes,
    shape_of,
)
from biasviz.store.reader import open_bias_file
from biasviz.store.summary_writer import join_summary_files
from tests.conftest import run_cli, small_model

N, T, R, HEADS = 3, 24, 6, 2
LAYERS = [0, 1]


@pytest.fixture(scope="module")
def summary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("table") / "alibi.h5"
    ids = np.random.default_rng(11).integers(0, 97, size=(N, T))
    biasviz.extract(small_model("alibi", n_head=HEADS), ids, path, layers=LAYERS, summary=True, device="cpu",
                    progress=False, resolution=R)  # fmt: skip
    return path


def _sizes() -> dict[str, int]:
    return dimension_sizes(heads=HEADS, seq_len=T, samples=N, blocks=-(-T // -(-T // R)))


def _layer_datasets(f: h5py.File, layer: int) -> dict[str, h5py.Dataset]:
    return {name: ds for name, ds in f[f"layer_{layer}"].items() if isinstance(ds, h5py.Dataset)}


def test_every_dataset_of_a_summary_is_a_row_of_the_table(summary: Path) -> None:
    with h5py.File(summary, "r") as f:
        for layer in LAYERS:
            held = _layer_datasets(f, layer)
            # the older datasets the table now holds as well as the measures
            assert {"bias_mean", "weights_std", "weights_profile", "diagnostics", POSITIONAL_PROFILE,
                    "positional_mean", KEY_PROFILE, SINK_SHARE, "band_mass", "sink_share_se"} <= set(held)  # fmt: skip
            assert not set(held) - set(ROWS), sorted(set(held) - set(ROWS))
            for name, ds in held.items():
                row = ROWS[name]
                assert ds.shape == shape_of(row, _sizes()), name
                assert tuple(d.label for d in ds.dims) == row.dims, name
                assert ds.dtype == row.dtype, name
    with open_bias_file(summary) as bf:  # the reader lists them in the table's order
        held = bf.summary_datasets(LAYERS[-1])
        assert list(held) == [name for name in ROWS if name in held]


def test_a_joined_sweep_puts_the_checkpoint_in_front_of_every_row(summary: Path, tmp_path: Path) -> None:
    out = join_summary_files([summary, summary], tmp_path / "sweep.h5", steps=[0, 10], attrs={})
    with h5py.File(out, "r") as f, h5py.File(summary, "r") as one:
        assert set(_layer_datasets(f, 1)) == set(_layer_datasets(one, 1))
        for name, ds in _layer_datasets(f, 1).items():
            row = ROWS[name]
            assert ds.shape == (2, *shape_of(row, _sizes())), name
            assert tuple(d.label for d in ds.dims) == ("checkpoint", *row.dims), name
            assert ds.dtype == row.dtype, name
            assert ds[1].tobytes() == one[f"layer_1/{name}"][()].tobytes(), name  # the bytes, NaN and all
        held = set(_layer_datasets(f, 1))
    with open_bias_file(out) as bf:
        assert bf.summary_datasets(1) == tuple(n for n in ROWS if n in held)


@pytest.mark.parametrize("name", [SINK_SHARE, POSITIONAL_PROFILE])
def test_the_validator_refuses_a_tabled_dataset_of_the_wrong_shape(name: str, summary: Path, tmp_path: Path) -> None:
    row = ROWS[name]
    good = shape_of(row, _sizes())
    wrong = (*good[:-1], good[-1] + 1)
    bad = shutil.copy(summary, tmp_path / "bad.h5")
    with h5py.File(bad, "r+") as f:
        del f[f"layer_1/{name}"]
        f.create_dataset(f"layer_1/{name}", data=np.zeros(wrong, np.float32))
    with pytest.raises(BiasvizError, match=rf"layer_1/{name} is float32 \({', '.join(map(str, wrong))}\), "
                                           rf"expected float \({', '.join(map(str, good))}\)"):  # fmt: skip
        open_bias_file(bad)


def test_info_labels_each_dataset_with_its_rows_dimensions(summary: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["info", str(summary)], capsys)
    assert code == 0, err
    for name in (POSITIONAL_PROFILE, SINK_SHARE, "band_mass"):
        shape = shape_of(ROWS[name], _sizes())
        dims = " x ".join(ROWS[name].dims)
        assert re.search(rf"layer_1/{name} +float32 {re.escape(str(shape))} \({dims}\), ", out), out


def test_the_xarray_view_labels_each_dataset_with_its_rows_dimensions(summary: Path) -> None:
    pytest.importorskip("xarray")
    with biasviz.open(summary) as view:
        data = view.to_xarray(layer=1)
    with h5py.File(summary, "r") as f:
        held = _layer_datasets(f, 1)
    for name in held:  # records: one variable per field
        row = ROWS[name]
        variables = [f"{name}_{field}" for field in row.dtype.names] if row.compound else [name]
        for variable in variables:
            assert data[variable].dims == row.dims, variable
            assert data[variable].shape == shape_of(row, _sizes()), variable
