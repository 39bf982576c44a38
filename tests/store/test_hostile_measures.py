"""Crafted numbers in docs/position-measures.md's datasets are refused, on every row of every dataset of the table: a
negative standard deviation, entropy or standard error, a share outside [0, 1], an entropy above log(keys), a sink-key
index outside the keys. Each used to pass as a result (an index of 10^6 made every head a secondary sink)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.common.errors import BiasvizError
from biasviz.store.reader import open_bias_file
from tests.conftest import small_model
from tests.hostile import Case, limited, run_case

T = 24
GROUP = "layer_1"


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("measures") / "good.h5"
    ids = np.random.default_rng(5).integers(0, 97, size=(4, T))  # 4 samples: standard errors are stored
    biasviz.extract(small_model("alibi", n_head=2), ids, path, layers=[1], summary=True, device="cpu",
                    progress=False, resolution=6)  # fmt: skip
    return path


Edit = Callable[[np.ndarray], np.ndarray]


def _at(index: tuple[int, ...], value: float) -> Edit:
    def edit(v: np.ndarray) -> np.ndarray:
        v = v.copy()
        v[index] = value
        return v

    return edit


def _sink_index(value: int) -> Edit:
    def edit(v: np.ndarray) -> np.ndarray:
        v = v.copy()
        v["index"][..., 0] = value
        return v

    return edit


# (dataset, edit, what the error says): each row kind of the table, in each of its rows
CRAFTED = [
    ("weights_entropy", _at((1, 0, 0), -0.5), "negative standard deviations"),
    ("weights_entropy", _at((0, 0, 0), -0.5), "entropies outside"),
    ("weights_entropy", _at((0, 0, -1), math.log(T) + 1), "entropies outside"),
    ("band_mass", _at((1, 0, 0), -0.25), "negative standard deviations"),
    ("band_mass", _at((0, 0, 0), 1.5), "shares outside"),
    ("context_mass", _at((1, 1, 2), -1e-3), "negative standard deviations"),
    ("band_mass_se", _at((0, 0), -0.1), "negative standard errors"),
    ("weights_entropy_se", _at((0, 0), -0.1), "negative standard errors"),
    ("sink_keys", _sink_index(10**6), "key indices outside"),
    ("sink_keys", _sink_index(-7), "key indices outside"),
]  # fmt: skip


def _crafted(good: Path, folder: Path, name: str, edit: Edit) -> Path:
    path = folder / "x.h5"
    shutil.copy(good, path)
    with h5py.File(path, "a") as f:
        ds = f[f"{GROUP}/{name}"]
        ds[...] = edit(ds[()])
    return path


@pytest.mark.parametrize(("name", "edit", "said"), CRAFTED, ids=[f"{c[0]}-{c[2]}" for c in CRAFTED])
def test_every_row_of_every_dataset_is_checked(good: Path, tmp_path: Path, name: str, edit: Edit, said: str) -> None:
    """Old code: only the mean row of share datasets was checked; these read back as results."""
    path = _crafted(good, tmp_path, name, edit)
    with limited(), open_bias_file(path) as f, pytest.raises(BiasvizError, match=f"{name} of layer 1 .*{said}"):
        f.summary_array(name, 1)


def test_the_untouched_file_reads(good: Path) -> None:
    """The same reads of the file as extract wrote it pass (the checks refuse the crafted values only)."""
    with limited(), open_bias_file(good) as f:
        for name in {c[0] for c in CRAFTED}:
            f.summary_array(name, 1)


@pytest.mark.parametrize("index", [10**6, -7])
def test_diagnose_refuses_a_sink_index_outside_the_keys(good: Path, tmp_path: Path, index: int,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: ``diagnose --json`` reported every head as a secondary sink."""
    root = tmp_path / "shared"
    root.mkdir()
    _crafted(good, root, "sink_keys", _sink_index(index))
    tmp = tmp_path / "case"
    tmp.mkdir()
    case = Case(f"sink index {index}", "diagnose {root}/x.h5 --json {tmp}/d.json --no-figures --out-dir {tmp}",
                rf"sink_keys of layer 1 holds key indices outside 0\.\.{T - 1}", subprocess=True)  # fmt: skip
    run_case(case, {"root": str(root)}, tmp, capsys)


# a NaN where every layer without a mask of its own attends (the table's ``filled``) -> refused; where nothing may have
# been attended (P over keys j >= 4 at the longest distances: no such key) -> read as it is
FILLED = [("sink_share", (0, 0), True), ("weights_key_profile", (0, 1, 3), True), ("weights_profile", (1, 0, 2), True),
          ("positional_profile", (0, 1, 5), True), ("positional_profile", (1, 1, T - 1), False)]  # fmt: skip


@pytest.mark.parametrize(("name", "index", "refused"), FILLED, ids=[f"{n}-{i}" for n, i, _ in FILLED])
def test_nan_is_refused_only_where_every_cell_is_attended(good: Path, tmp_path: Path, name: str,
                                                          index: tuple[int, ...], refused: bool) -> None:  # fmt: skip
    path = _crafted(good, tmp_path, name, _at(index, math.nan))
    with limited(), open_bias_file(path) as f:
        if refused:
            with pytest.raises(BiasvizError, match=f"{name} of layer 1 holds NaN or infinite values"):
                f.summary_array(name, 1)
        else:
            assert np.isnan(f.summary_array(name, 1)[index])


def test_summary_array_reads_every_dataset_the_layer_holds_as_stored(good: Path) -> None:
    """Every name of the table a layer holds reads through one call, the values h5py reads from the file (a block map
    NaN where its blocks hold no cell); a name outside the table is refused, naming the table's."""
    with open_bias_file(good) as f, h5py.File(good, "r") as raw:
        held = f.summary_datasets(1)
        assert {"positional_profile", "weights_key_profile", "sink_share", "band_mass", "diagnostics"} <= set(held)
        for name in held:
            stored, got = raw[f"{GROUP}/{name}"][()], f.summary_array(name, 1)
            if stored.dtype.names:
                assert got.dtype.names == stored.dtype.names
                for field in stored.dtype.names:
                    np.testing.assert_array_equal(got[field], stored[field])
            elif name.endswith(("_mean", "_std")) and stored.shape[-1] == stored.shape[-2]:  # a block map
                np.testing.assert_array_equal(got[np.isfinite(got)], stored[np.isfinite(got)])
                assert np.isfinite(got[:, -1, 0]).all() and np.isnan(got[:, 0, -1]).all()  # below / above the diagonal
            else:
                np.testing.assert_array_equal(got, stored.astype(np.float64))
        with pytest.raises(ValueError, match="not a dataset of a summary layer: 'logits' .*sink_share"):
            f.summary_array("logits", 1)
