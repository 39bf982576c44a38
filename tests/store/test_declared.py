"""Declared sizes checked before any read (:mod:`biasviz.store.declared`): the largest piece a reader takes of each
dataset, worked out by hand from its shape and type, and the refusal of a file that declares more than the memory
biasviz may use (here a budget set by the test)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz.store.declared as declared
from biasviz.common.errors import BiasvizError
from biasviz.store.declared import check_declared, largest_read
from biasviz.store.validation import AttrChecks


def checks(f: h5py.File, path: Path) -> AttrChecks:
    c = AttrChecks()
    c.path, c._h5 = path, f
    return c


@pytest.mark.parametrize(("shape", "dtype", "lead", "matrices", "nbytes"), [
    ((2, 3, 5, 5), "f4", 0, False, 2 * 3 * 5 * 5 * 8),  # whole, read as float64
    ((2, 3, 5, 5), "f4", 0, True, 5 * 5 * 8),  # one (sample, head) matrix
    ((4, 2, 3, 6, 6), "f8", 1, True, 6 * 6 * 8),  # a sweep: one checkpoint's matrix
    ((4, 2, 3, 6, 6), "f2", 1, False, 2 * 3 * 6 * 6 * 8),  # one checkpoint whole
    ((4, 3, 10, 10), "f4", 1, True, 3 * 10 * 10 * 8),  # too few axes for matrices: one checkpoint whole
    ((100,), "i1", 0, False, 100 * 8),  # at least float64 per value
    ((10,), [("a", "i2"), ("b", "i2")], 0, False, 10 * 4),  # records: their own size
    ((12,), [("x", "f8"), ("y", "f8"), ("z", "f8")], 0, False, 12 * 24),
])  # fmt: skip
def test_the_largest_read_of_a_dataset(tmp_path: Path, shape: tuple[int, ...], dtype: object, lead: int,
                                       matrices: bool, nbytes: int) -> None:  # fmt: skip
    with h5py.File(tmp_path / "a.h5", "w") as f:
        ds = f.create_dataset("x", shape=shape, dtype=np.dtype(dtype))
        assert largest_read(ds, lead=lead, matrices=matrices) == nbytes


def declaring(path: Path, *, heads: int, t: int, datasets: dict[str, tuple[int, ...]]) -> Path:
    """A file whose datasets are declared, never written (HDF5 stores no chunk it was not given)."""
    with h5py.File(path, "w") as f:
        f.attrs.update({"n_heads": heads, "seq_len": t})
        for name, shape in datasets.items():
            f.create_dataset(name, shape=shape, dtype="f4", chunks=(1,) * (len(shape) - 1) + (shape[-1],))
    return path


def refusal(path: Path, budget: int, monkeypatch: pytest.MonkeyPatch, *, summary: bool = False) -> str | None:
    """The error check_declared gives under ``budget`` bytes, or None."""
    monkeypatch.setattr(declared, "memory_budget", lambda: budget)
    with h5py.File(path) as f:
        try:
            check_declared(checks(f, path), seq_len=int(f.attrs["seq_len"]), n_heads=int(f.attrs["n_heads"]),
                           summary=summary)  # fmt: skip
        except BiasvizError as exc:
            return str(exc)
    return None


def test_profiles_the_attributes_imply_are_set_against_the_budget(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    path = declaring(tmp_path / "a.h5", heads=4, t=1024, datasets={})
    implied = 2 * 4 * (2 * 1024) * 8  # mean and std per head over 2T signed distances, float64: 128 KiB
    assert refusal(path, implied, monkeypatch) is None
    err = refusal(path, implied - 1, monkeypatch)
    assert err is not None and err.startswith(f"{path} is not a valid biasviz file: ")
    assert "'n_heads' (4) and 'seq_len' (1024) declare profiles of 128.0 KiB" in err and "damaged or crafted" in err


def test_a_full_files_layer_is_read_one_matrix_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = declaring(tmp_path / "a.h5", heads=1, t=1, datasets={"layer_1/weights": (2, 3, 100, 100)})
    matrix = 100 * 100 * 8
    assert refusal(path, matrix, monkeypatch) is None
    err = refusal(path, matrix - 1, monkeypatch)
    assert err is not None and "'layer_1/weights' declares shape (2, 3, 100, 100), 78.1 KiB to read" in err
    # a summary's dataset is read whole
    assert "'layer_1/weights' declares" in refusal(path, matrix, monkeypatch, summary=True)
    assert refusal(path, 2 * 3 * matrix, monkeypatch, summary=True) is None


def test_a_sweeps_checkpoint_axis_is_read_one_checkpoint_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = declaring(tmp_path / "a.h5", heads=1, t=1, datasets={"checkpoint": (5,), "layer_0/bias": (5, 2, 3, 50, 50),
                                                                "layer_0/bias_profile": (5, 2, 3, 1000)})  # fmt: skip
    matrix, profile = 50 * 50 * 8, 2 * 3 * 1000 * 8  # one checkpoint's matrix; one checkpoint's profile, whole
    assert refusal(path, profile, monkeypatch) is None
    assert "'layer_0/bias_profile' declares shape (5, 2, 3, 1000)" in refusal(path, profile - 1, monkeypatch)
    assert "'layer_0/bias' declares shape (5, 2, 3, 50, 50)" in refusal(path, matrix - 1, monkeypatch)
    assert "'layer_0/bias' declares" in refusal(path, profile, monkeypatch, summary=True)  # a summary's: whole
    assert refusal(path, 2 * 3 * matrix, monkeypatch, summary=True) is None


def test_a_root_dataset_is_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = declaring(tmp_path / "a.h5", heads=1, t=1, datasets={"input_ids": (3, 1000)})
    assert refusal(path, 3 * 1000 * 8, monkeypatch) is None
    assert "'input_ids' declares shape (3, 1000)" in refusal(path, 3 * 1000 * 8 - 1, monkeypatch)


def test_no_known_budget_checks_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = declaring(tmp_path / "a.h5", heads=2**20, t=2**31, datasets={"layer_1/weights": (1, 1, 2**31, 2**31)})
    monkeypatch.setattr(declared, "memory_budget", lambda: None)
    with h5py.File(path) as f:
        check_declared(checks(f, path), seq_len=2**31, n_heads=2**20, summary=False)
