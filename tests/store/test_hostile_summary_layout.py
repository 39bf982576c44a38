"""Summary layouts the format allows read back, and ones it rules out are refused: a layer's ``attended`` share stored
once for all heads (1, query_block, key_block), as docs/hdf5.md, 'Attended cells' allows; standard errors in a file of
two samples (docs/position-measures.md: N < 3 has none), which diagnose printed beside the note that it has none."""

from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

import biasviz
from biasviz.store.reader import open_bias_file
from tests.conftest import small_model
from tests.hostile import Case, limited, run, run_case
from tests.summary_files import cable, weights_of, write_summary

T = 8


def _windowed(path: Path, heads_axis: int) -> Path:
    """A weights summary at one position per block whose layer attends a sliding window of 3 keys."""
    write_summary(path, scheme="nope", weights=weights_of(cable(2, 3, T)), resolution=T)
    d = np.subtract.outer(np.arange(T), np.arange(T))
    share = ((d >= 0) & (d < 3)).astype(np.float32)
    with h5py.File(path, "a") as f:
        f.attrs["mask"] = "model"
        g = f["layer_3"]
        g.create_dataset("attended", data=np.broadcast_to(share, (heads_axis, T, T)))
        for name in ("weights_mean", "weights_std"):
            m = g[name][()]
            m[:, share == 0] = np.nan
            g[name][...] = m
    return path


@pytest.mark.parametrize("heads_axis", [1, 3], ids=["one-for-all-heads", "per-head"])
def test_an_attended_share_for_all_heads_reads(heads_axis: int, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: (1, T, T) was 'not a valid biasviz file' in plot --kind weights."""
    path = _windowed(tmp_path / "w.h5", heads_axis)
    code, _out, err = run(["plot", "--scheme", "nope", "--kind", "weights", "--input", str(path), "--out-dir",
                           str(tmp_path / "f"), "--format", "png"], capsys, in_subprocess=True)  # fmt: skip
    assert code == 0, err
    assert "Traceback" not in err
    assert [p.suffix for p in (tmp_path / "f").iterdir()] == [".png"]
    d = np.subtract.outer(np.arange(T), np.arange(T))
    with limited(), open_bias_file(path) as f:  # blocks outside the window read as NaN, those inside as numbers
        m = f.summary_map("weights_mean", 3)
    assert np.isnan(m[:, (d < 0) | (d >= 3)]).all() and np.isfinite(m[:, (d >= 0) & (d < 3)]).all()


@pytest.fixture(scope="module")
def two_samples(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A two-sample summary, and a three-sample one to copy standard errors from."""
    root = tmp_path_factory.mktemp("se")
    rng = np.random.default_rng(3)
    out = []
    for n in (2, 3):
        path = root / f"n{n}.h5"
        biasviz.extract(small_model("alibi", n_head=2), rng.integers(0, 97, size=(n, 16)), path, layers=[1],
                        summary=True, device="cpu", progress=False, resolution=4)  # fmt: skip
        out.append(path)
    return out[0], out[1]


def test_standard_errors_of_two_samples_are_refused(two_samples: tuple[Path, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: diagnose printed the copied standard errors and the note that two samples have none."""
    two, three = two_samples
    root = tmp_path / "shared"
    root.mkdir()
    crafted = shutil.copy(two, root / "x.h5")
    with h5py.File(three) as src, h5py.File(crafted, "a") as dst:
        names = [n for n in src["layer_1"] if n.endswith("_se")]
        assert names
        for name in names:
            src.copy(src[f"layer_1/{name}"], dst["layer_1"], name=name)
    tmp = tmp_path / "case"
    tmp.mkdir()
    case = Case("SEs over two samples", "diagnose {root}/x.h5 --json {tmp}/d.json --no-figures --out-dir {tmp}",
                r"layer_1/\w+_se is a standard error over 2 samples", subprocess=True)  # fmt: skip
    run_case(case, {"root": str(root)}, tmp, capsys)
