"""docs/positional.md from the command line: plot --kind positional / sinks / profile, diagnose, and bad input.

Files come from ``biasviz extract --summary`` on small saved models; what the figures and the JSON show is
compared with the file's own arrays read with h5py and reduced by numpy, never with biasviz's readers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from biasviz.diagnostics.measures import diagnose_array
from tests.conftest import exit_code, run_cli, saved_figures, small_model

T = 40
TEXT = "def f(x):\n    return [x * i for i in range(10)]  # a line of code\n" * 300


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import pytest as _pytest

    d = tmp_path_factory.mktemp("pos")
    (d / "text.txt").write_text(TEXT)
    for scheme in ("rope", "alibi"):
        small_model(scheme, vocab_size=300).save_pretrained(d / scheme)
    common = ["extract", "--text", str(d / "text.txt"), "--seq-len", str(T), "--device", "cpu", "--quiet",
              "--summary"]  # fmt: skip
    made = {"rope": ["--model", str(d / "rope"), "--samples", "3", "--resolution", str(T)],
            "alibi": ["--model", str(d / "alibi"), "--samples", "3", "--resolution", "8"],
            "one": ["--model", str(d / "rope"), "--samples", "1", "--resolution", str(T)]}  # fmt: skip
    from biasviz.cli import main

    for name, args in made.items():
        try:
            main([*common, *args, "--out", str(d / f"{name}.h5")])
        except SystemExit as exc:
            _pytest.fail(f"extract {name} exited {exc.code}")
    text = ["--text", str(d / "text.txt")]
    for name, args in (("bias-only", ["--bias-only", "--resolution", "8"]), ("full", ["--samples", "2", *text])):
        base = ["extract", "--model", str(d / "alibi"), "--seq-len", str(T), "--device", "cpu", "--quiet"]
        try:
            main([*base, *args, "--out", str(d / f"{name}.h5")])
        except SystemExit as exc:
            _pytest.fail(f"extract {name} exited {exc.code}")
    return {name: d / f"{name}.h5" for name in ("rope", "alibi", "one", "bias-only", "full")}


#: (exit code, stdout, stderr, the figures saved by file stem) of a command run once for a module
Run = tuple[int, str, str, dict[str, Any]]
#: (the JSON's path, exit code, stderr, the figures saved by file stem) of diagnose run once
DiagnoseRun = tuple[Path, int, str, dict[str, Any]]


def _run_once(argv: list[str]) -> Run:
    """``biasviz ARGV`` in-process for a module's fixture: (exit code, stdout, stderr, every figure it saved by file
    stem), as run_cli and the ``figures`` fixture give them to a test."""
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        caught = saved_figures(mp)
        code = exit_code(argv)
    return code, out.getvalue(), err.getvalue(), caught


@pytest.fixture(scope="module")
def profile_run(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``plot --kind profile`` of the RoPE file, drawn once: the positional and the weights profile, read by two
    tests (PNG only: no test here reads the figures' files, only the figures drawn and the names written)."""
    return _run_once(["plot", "--scheme", "rope", "--input", str(files["rope"]), "--kind", "profile", "--format",
                      "png", "--out-dir", str(tmp_path_factory.mktemp("profile"))])  # fmt: skip


@pytest.fixture(scope="module")
def diagnose_run(files: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> DiagnoseRun:
    """``diagnose`` of the RoPE and ALiBi files, run once: its JSON and its figure are each read by a test (PNG
    only: neither test reads the figures' files). (the JSON's path, exit code, stderr, the figures)"""
    d = tmp_path_factory.mktemp("diagnose")
    code, _, err, figs = _run_once(["diagnose", str(files["rope"]), str(files["alibi"]), "--json", str(d / "d.json"),
                                    "--out-dir", str(d), "--format", "png"])  # fmt: skip
    return d / "d.json", code, err, figs


def test_the_positional_grid_draws_each_heads_p_relative_to_its_value_at_distance_0(
    files: dict[str, Path], figures: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:  # fmt: skip
    code, out, err = run_cli(["plot", "--scheme", "rope", "--input", str(files["rope"]), "--kind", "positional",
                              "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "rope_positional.pdf").is_file() and (tmp_path / "rope_positional.png").is_file()
    with h5py.File(files["rope"]) as f:
        p = f["layer_1/positional_mean"][()].astype(np.float64)  # (H, T, T) at R = T
    at_zero = np.array([np.diagonal(p[h]).mean() for h in range(p.shape[0])])
    fig = figures["rope_positional"]
    shown = [ax.get_images()[0].get_array() for ax in fig.axes if ax.get_images()]
    assert len(shown) == 12
    for h, image in enumerate(shown):
        want = p[h] - at_zero[h]
        got = np.ma.filled(np.ma.asarray(image, dtype=np.float64), np.nan)
        lower = np.tril(np.ones((T, T), bool))
        np.testing.assert_allclose(got[lower], want[lower], rtol=1e-5, atol=1e-6)
    assert " ".join(fig.get_suptitle().split()).startswith(
        f"RoPE positional logits P(i, j) − P(d = 0): final layer, 2 of 2; T = {T}; mean of 3 samples")


def test_sinks_and_the_positional_profile(files: dict[str, Path], figures: dict[str, Any], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          profile_run: Run) -> None:  # fmt: skip
    code, _, err = run_cli(["plot", "--scheme", "rope", "--input", str(files["rope"]), "--kind", "sinks",
                            "--format", "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    with h5py.File(files["rope"]) as f:
        key0 = f["layer_1/weights_key_profile"][0, :, :16]
        share = f["layer_1/sink_share"][()]
        p_all, p_late = f["layer_1/positional_profile"][()]
    lines = [ax.get_lines()[0].get_ydata() for ax in figures["rope_sinks"].axes if ax.get_lines()]
    np.testing.assert_allclose(np.array(lines), key0, rtol=1e-6)
    title = " ".join(figures["rope_sinks"].get_suptitle().split())  # wrapped to the figure's width
    assert f"{int((key0[:, 0] > 0.3).sum())} of 12 from the mean" in title
    assert f"{100 * (share > 0.3).mean():.0f}% of (sample, head) pairs" in title
    code, out, err, profiles = profile_run
    assert code == 0, err
    assert "rope_positional_profile.png" in out and "rope_weights_profile.png" in out
    ax = next(a for a in profiles["rope_positional_profile"].axes if a.get_lines())
    np.testing.assert_allclose(ax.get_lines()[0].get_ydata(), p_all[0], rtol=1e-6)
    np.testing.assert_allclose(ax.get_lines()[1].get_ydata(), p_late[0], rtol=1e-6, equal_nan=True)
    assert " ".join(profiles["rope_positional_profile"].get_suptitle().split()).startswith(
        f"RoPE positional logits by distance: final layer, 2 of 2; T = {T}; mean of 3 samples")
    assert title.startswith(f"RoPE weight on the first keys: final layer, 2 of 2; T = {T}")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = profiles["rope_positional_profile"]
    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0].get_window_extent(renderer)
    labels = [t for t in (fig._supxlabel, *(a.xaxis.label for a in fig.axes)) if t is not None and t.get_text()]
    assert labels and not any(legend.overlaps(t.get_window_extent(renderer)) for t in labels)  # the legend clear


def test_diagnose_reports_ps_residuals_and_the_sink_heads(files: dict[str, Path], diagnose_run: DiagnoseRun) -> None:
    json_path, code, err, _ = diagnose_run
    assert code == 0, err
    doc = json.loads(json_path.read_text())["schemes"]
    assert doc["rope"]["heads"] == []  # no bias, but measured all the same
    with h5py.File(files["rope"]) as f:
        p = f["layer_1/positional_mean"][()].astype(np.float64)
        share = f["layer_1/sink_share"][()].astype(np.float64)
        first = f["layer_1/weights_key_profile"][0, :, 0].astype(np.float64)
    ref = diagnose_array(p[None])  # P as one (query, key) matrix per head, by the definitions of section 6
    for h, d in enumerate(ref):
        got = doc["rope"]["positional"]["heads"][h]
        assert got["context_dependence"] is None
        assert got["toeplitz_residual"] == pytest.approx(d.toeplitz_residual, rel=1e-4, abs=1e-6)
        assert got["separability_residual"] == pytest.approx(d.separability_residual, rel=1e-4, abs=1e-6)
    sinks = doc["rope"]["sinks"]
    assert sinks["epsilon"] == 0.3
    np.testing.assert_allclose(sinks["share_per_head"], first, rtol=1e-6)
    assert sinks["sink_heads_per_sample"] == pytest.approx((share > 0.3).mean())
    assert "positional" in doc["alibi"] and len(doc["alibi"]["heads"]) == 12


@pytest.mark.parametrize(("name", "kind", "words"), [
    ("one", "positional", "two samples or more"),
    ("bias-only", "positional", "--bias-only"),
    ("bias-only", "sinks", "--bias-only"),
    ("full", "positional", "extract --summary"),
])  # fmt: skip
def test_position_figures_of_files_without_them_are_one_error(files: dict[str, Path], tmp_path: Path, name: str,
                                                              kind: str, words: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    scheme = "rope" if name == "one" else "alibi"
    code, _, err = run_cli(["plot", "--scheme", scheme, "--input", str(files[name]), "--kind", kind, "--out-dir",
                            str(tmp_path / "out")], capsys)  # fmt: skip
    assert code != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and words in lines[0], err
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_the_diagnostics_figure_draws_each_heads_sink_share_where_the_file_holds_it(
    files: dict[str, Path], diagnose_run: DiagnoseRun
) -> None:
    """A fourth row: each head's mean weight on key 0, read from the file's key profile, with the threshold 0.3."""
    _, code, err, figs = diagnose_run
    assert code == 0, err
    axes = figs["diagnostics"].axes
    assert len(axes) == 4 and "Sink share" in axes[-1].get_ylabel()
    assert axes[-1].get_ylim() == (0.0, 1.0)
    lines = [line for line in axes[-1].get_lines() if line.get_linestyle() == "None"]
    assert len(lines) == 2  # one marker series per file, in the order given
    for line, name in zip(lines, ("rope", "alibi"), strict=True):
        with h5py.File(files[name]) as f:
            first = f["layer_1/weights_key_profile"][0, :, 0].astype(np.float64)
        np.testing.assert_allclose(line.get_ydata(), first, rtol=1e-6)
        np.testing.assert_allclose(np.round(line.get_xdata()), np.arange(1, first.size + 1))
    assert any(line.get_ydata()[0] == 0.3 for line in axes[-1].get_lines() if line.get_linestyle() != "None")


def test_a_one_sample_summary_says_why_it_holds_no_positional_logits(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = files["rope"].parent / "rope"
    text = files["rope"].parent / "text.txt"
    base = ["extract", "--model", str(model), "--text", str(text), "--seq-len", str(T), "--device", "cpu", "--summary",
            "--resolution", "8"]  # fmt: skip
    code, out, err = run_cli([*base, "--samples", "1", "--out", str(tmp_path / "one.h5")], capsys)
    assert code == 0, err
    notes = [line for line in err.splitlines() if "positional logits" in line]
    assert len(notes) == 1 and notes[0].startswith("note:") and "two samples or more" in notes[0], err
    with h5py.File(tmp_path / "one.h5") as f:
        assert "positional_mean" not in f["layer_1"]
    code, out, err = run_cli([*base, "--samples", "2", "--out", str(tmp_path / "two.h5")], capsys)
    assert code == 0 and "two samples or more" not in err, err
    assert "positional logits" in out


def test_the_weights_profile_band_stops_at_zero(files: dict[str, Path],
                                                profile_run: Run) -> None:  # fmt: skip
    """Attention weights are never below 0: the ±std band of their distance profile stops there, while the
    profile's own mean - std does reach below 0 (else this test could not fail)."""
    code, _, err, profiles = profile_run
    assert code == 0, err
    with h5py.File(files["rope"]) as f:
        mean, std = f["layer_1/weights_profile"][()].astype(np.float64)
    assert (mean - std < 0).any()
    fig = profiles["rope_weights_profile"]
    bands = [c for ax in fig.axes for c in ax.collections]
    assert len(bands) == mean.shape[0]
    for h, band in enumerate(bands):
        low = band.get_paths()[0].vertices[:, 1]
        assert low.min() >= 0.0
        np.testing.assert_allclose(low.min(), np.maximum(mean[h] - std[h], 0).min(), atol=1e-6)
