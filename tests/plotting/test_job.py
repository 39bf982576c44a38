"""The plot job (:mod:`biasviz.plotting.job`): what each kind hands its sink (stem, formats, caption, metadata) and
what its figures draw, set against the matrices the test wrote (tests/summary_files.py, h5py and numpy), and the
checks it makes of the file before it draws."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import biasviz.store.reader as reader
from biasviz.common.errors import BiasvizError
from biasviz.plotting.job import PlotJob, run_dynamics, run_matrices, run_over_samples
from tests.summary_files import cable, profile, weights_of, write_full, write_summary

N, H, T = 3, 2, 8
LOWER = np.tril(np.ones((T, T), bool))


@pytest.fixture(scope="module")
def bias() -> np.ndarray:
    return cable(N, H, T)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, bias: np.ndarray) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("job")
    return {"full": write_full(d / "cable.h5", "cable", bias, weights_of(bias)),
            "one": write_full(d / "one.h5", "cable", bias[:1], weights_of(bias[:1])),
            "key-position": write_full(d / "key.h5", "alibi", bias, weights_of(bias)),
            "sweep": write_summary(d / "sweep.h5", bias=bias, weights=weights_of(bias), resolution=T,
                                   steps=[0, 50, 100]),
            "summary": write_summary(d / "summary.h5", bias=bias, weights=weights_of(bias), resolution=4)}  # fmt: skip


@pytest.fixture(autouse=True)
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files the job opens isolated: the child's check is store/guard's (tests/store/test_guard.py), and
    here only costs a process per figure."""
    seen: list[Path] = []
    monkeypatch.setattr(reader, "check_isolated", seen.append)
    return seen


class Sink:
    """Keeps what the job hands over; answers with the stem as the one file 'written'."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []

    def __call__(self, fig: Any, stem: Path, formats: list[str], caption: str | None,
                 options: dict[str, Any]) -> list[Path]:  # fmt: skip
        self.got.append({"fig": fig, "stem": stem, "formats": formats, "caption": caption, **options})
        return [stem]

    def stems(self) -> list[str]:
        return [g["stem"].name for g in self.got]


def job(path: Path, sink: Sink, **changes: Any) -> PlotJob:
    options = {"scheme": "cable", "path": path, "layer": -1, "sample": 0, "normalize": "none", "shared_scale": None,
               "cmap": None, "log_scale": False, "log_distance": False, "style": "neurips", "reduce_how": "mean",
               "max_cells": None, "sink": sink}  # fmt: skip
    return PlotJob(**{**options, **changes})


def panels(fig: Any) -> list[np.ndarray]:
    """Each head's drawn matrix, masked cells as NaN."""
    return [np.ma.filled(np.ma.asarray(ax.get_images()[0].get_array(), dtype=np.float64), np.nan)
            for ax in fig.axes if ax.get_images()]  # fmt: skip


def test_each_matrix_goes_to_the_sink_with_its_stem_formats_and_provenance(
    files: dict[str, Path], bias: np.ndarray, opened: list[Path], tmp_path: Path
) -> None:
    sink = Sink()
    written = run_matrices(job(files["full"], sink, sample=1), "all", tmp_path, ["png", "pdf"], 60)
    assert written == [tmp_path / "cable_bias", tmp_path / "cable_weights"]  # what the sink answered, in order
    assert opened == [files["full"]]  # opened once, isolated
    for got, kind, matrices in zip(sink.got, ("bias", "weights"), (bias, weights_of(bias)), strict=True):
        assert got["formats"] == ["png", "pdf"] and got["dpi"] == 60
        assert "scheme=cable; kind=" + kind + "; layer=3; sample=1; normalize=none" in got["info"]["keywords"]
        assert got["info"]["source"].endswith("cable.h5") and "\\caption{" in got["caption"]
        drawn = panels(got["fig"])
        assert len(drawn) == H
        for h in range(H):
            np.testing.assert_allclose(drawn[h][LOWER], matrices[1, h][LOWER], rtol=1e-6, atol=1e-7)


def test_normalize_diagonal_draws_each_row_relative_to_its_diagonal(files: dict[str, Path], bias: np.ndarray,
                                                                    tmp_path: Path) -> None:  # fmt: skip
    sink = Sink()
    run_matrices(job(files["full"], sink, normalize="diagonal"), "bias", tmp_path, ["png"], 60)
    assert sink.stems() == ["cable_bias"] and "normalize=diagonal" in sink.got[0]["info"]["keywords"]
    want = bias[0].astype(np.float64) - np.diagonal(bias[0], axis1=-2, axis2=-1)[..., :, None]
    for h, drawn in enumerate(panels(sink.got[0]["fig"])):
        np.testing.assert_allclose(drawn[LOWER], want[h][LOWER], rtol=1e-5, atol=1e-6)


def test_std_is_the_population_std_over_samples_per_cell(files: dict[str, Path], bias: np.ndarray,
                                                         tmp_path: Path) -> None:  # fmt: skip
    sink = Sink()
    run_over_samples(job(files["full"], sink), "std", tmp_path, ["png"], 60)
    assert sink.stems() == ["cable_bias_std", "cable_weights_std"]
    for got, x in zip(sink.got, (bias, weights_of(bias)), strict=True):
        want = x.astype(np.float64).std(axis=0)  # ddof 0
        for h, drawn in enumerate(panels(got["fig"])):
            np.testing.assert_allclose(drawn[LOWER], want[h][LOWER], rtol=1e-5, atol=1e-6)
    with pytest.raises(BiasvizError, match=r"--kind std shows the spread over samples; .*one\.h5 holds 1 sample"):
        run_over_samples(job(files["one"], Sink()), "std", tmp_path, ["png"], 60)


def test_profiles_draw_numpys_mean_by_distance(files: dict[str, Path], bias: np.ndarray, tmp_path: Path) -> None:
    sink = Sink()
    run_over_samples(job(files["full"], sink), "profile", tmp_path, ["png"], 60)
    assert sink.stems() == ["cable_bias_profile", "cable_weights_profile"]
    assert {got["style"] for got in sink.got} == {"neurips"}
    for got, x in zip(sink.got, (bias, weights_of(bias)), strict=True):
        want = profile(x)[0]
        lines = [ax.lines[0].get_ydata() for ax in got["fig"].axes if ax.get_visible() and ax.lines]
        assert len(lines) == H
        for h in range(H):
            np.testing.assert_allclose(lines[h], want[h], rtol=1e-5, atol=1e-6)


def test_dynamics_draw_each_checkpoints_profile(files: dict[str, Path], bias: np.ndarray, tmp_path: Path) -> None:
    sink = Sink()
    run_dynamics(job(files["sweep"], sink, style="icml"), "dynamics", tmp_path, ["png"], 60)
    ((got),) = sink.got
    assert got["stem"] == tmp_path / "cable_dynamics" and got["style"] == "icml"
    assert "steps 0, 50, 100" in got["info"]["description"]
    want = profile(bias)[0]
    heads = [ax for ax in got["fig"].axes if ax.get_visible() and ax.lines]
    assert len(heads) == H
    for h, ax in enumerate(heads):
        assert len(ax.lines) >= 3  # one line per checkpoint
        for line in ax.lines[-3:]:  # every checkpoint of this sweep holds the same data
            np.testing.assert_allclose(line.get_ydata(), want[h], rtol=1e-5, atol=1e-6)
    with pytest.raises(BiasvizError, match=r"--kind dynamics needs a sweep file .*cable\.h5 holds one checkpoint"):
        run_dynamics(job(files["full"], Sink()), "dynamics", tmp_path, ["png"], 60)
    with pytest.raises(BiasvizError, match=r"sweep\.h5 is a summary file: .*drop --normalize"):
        run_dynamics(job(files["sweep"], Sink(), normalize="diagonal"), "dynamics", tmp_path, ["png"], 60)


def test_a_step_chooses_a_sweeps_checkpoint_and_a_sweep_without_one_draws_the_last(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = Sink()
    run_matrices(job(files["sweep"], sink, step=50), "bias", tmp_path, ["png"], 60)
    assert sink.stems() == ["cable_bias"] and "note" not in capsys.readouterr().err
    run_matrices(job(files["sweep"], Sink()), "bias", tmp_path, ["png"], 60)
    err = capsys.readouterr().err
    assert "note: " in err and "sweep.h5 is a sweep of 3 checkpoints; drawing the last (step 100)" in err
    with pytest.raises(BiasvizError, match=r"^--step 75: it holds steps 0, 50, 100$"):
        run_matrices(job(files["sweep"], Sink(), step=75), "bias", tmp_path, ["png"], 60)
    with pytest.raises(BiasvizError, match=r"^--step 50: it is not a sweep$"):
        run_matrices(job(files["full"], Sink(), step=50), "bias", tmp_path, ["png"], 60)


def test_what_the_file_cannot_give_is_one_error_before_anything_is_drawn(files: dict[str, Path],
                                                                        tmp_path: Path) -> None:  # fmt: skip
    sink = Sink()
    with pytest.raises(BiasvizError, match=r"cable\.h5 holds scheme 'cable', not 'alibi'; pass --scheme cable"):
        run_matrices(job(files["full"], sink, scheme="alibi"), "bias", tmp_path, ["png"], 60)
    with pytest.raises(BiasvizError, match="summary"):
        run_matrices(job(files["summary"], sink, sample=1, sample_given=True), "bias", tmp_path, ["png"], 60)
    assert sink.got == []


def test_a_summary_draws_its_block_means(files: dict[str, Path], bias: np.ndarray, tmp_path: Path) -> None:
    sink = Sink()
    run_matrices(job(files["summary"], sink), "bias", tmp_path, ["png"], 60)
    cells = np.where(LOWER, bias.astype(np.float64), np.nan).mean(0)  # the mean over samples, (H, T, T)
    want = np.array([[[np.nanmean(cells[h, 2 * a:2 * a + 2, 2 * b:2 * b + 2]) if a >= b else np.nan for b in range(4)]
                      for a in range(4)] for h in range(H)])  # blocks of ceil(8 / 4) = 2 positions, 4 per axis
    drawn = panels(sink.got[0]["fig"])
    for h in range(H):
        np.testing.assert_allclose(drawn[h], want[h], rtol=1e-5, atol=1e-6)
    assert "block means of 2 × 2 positions" in " ".join(sink.got[0]["fig"].get_suptitle().split())


def test_a_key_position_bias_is_noted(files: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import h5py

    path = tmp_path / "key.h5"
    path.write_bytes(files["key-position"].read_bytes())
    with h5py.File(path, "a") as f:
        f.attrs["bias_convention"] = "key-position"
    run_matrices(job(path, Sink(), scheme="alibi"), "bias", tmp_path, ["png"], 60)
    assert "note: this file stores the bias in key-position form" in capsys.readouterr().err
    run_matrices(job(path, Sink(), scheme="alibi", normalize="diagonal"), "bias", tmp_path, ["png"], 60)
    assert "key-position" not in capsys.readouterr().err


@pytest.mark.parametrize("style", ["icml", "acl"])
def test_every_figure_is_saved_in_the_style_asked_for(files: dict[str, Path], tmp_path: Path, style: str) -> None:
    """The paper settings a figure is saved under (math font, font embedding) are the venue's asked for: the heat
    maps' as the profiles' and the dynamics'."""
    sink = Sink()
    run_matrices(job(files["full"], sink, style=style), "all", tmp_path, ["png"], 60)
    run_over_samples(job(files["full"], sink, style=style), "profile", tmp_path, ["png"], 60)
    run_dynamics(job(files["sweep"], sink, style=style), "dynamics", tmp_path, ["png"], 60)
    assert len(sink.got) >= 5 and {got["style"] for got in sink.got} == {style}
