"""``biasviz.plot`` and ``view.plot`` return the figure ``biasviz plot`` saves: rendered at the same dpi, outside
any style context (as a notebook or a script's ``savefig`` renders it), pixel for pixel the command's PNG."""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

import biasviz
from biasviz.common.errors import BiasvizError, UsageError
from tests.conftest import run_cli
from tests.summary_files import cable, weights_of, write_summary

DPI = 60
pytestmark = pytest.mark.slow  # whole CLI runs and figures rendered: make test-fast leaves them out


def pixels_of(fig: object) -> np.ndarray:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)  # type: ignore[attr-defined]
    buf.seek(0)
    return mpimg.imread(buf, format="png")


def command_png(args: list[str], out: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, np.ndarray]:
    code, _, err = run_cli(["plot", *args, "--format", "png", "--dpi", str(DPI), "--out-dir", str(out)], capsys)
    assert code == 0, err
    return {p.stem: mpimg.imread(p) for p in sorted(out.glob("*.png"))}


def test_the_returned_figure_is_the_commands_png(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)  # where the command's default --out-dir (figures) would be
    file = make_bias_file(tmp_path / "cable.h5", "cable", n=3, heads=4, t=24)
    want = command_png(["--scheme", "cable", "--input", str(file), "--kind", "weights", "--sample", "1", "--log",
                        "--style", "acl-column"], tmp_path / "cli", capsys)  # fmt: skip
    fig = biasviz.plot(file, kind="weights", sample=1, log=True, style="acl-column", dpi=DPI)
    assert set(want) == {"cable_weights"}
    got = pixels_of(fig)
    assert got.shape == want["cable_weights"].shape and np.array_equal(got, want["cable_weights"])
    assert np.ptp(got[..., :3]) > 0.5  # a picture, not a blank page that any other would equal
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cable.h5", "cli"]  # Python wrote nothing


def test_view_plot_of_a_summary_returns_each_figure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bias = cable(3, 4, 16)
    file = write_summary(tmp_path / "s.h5", bias=bias, weights=weights_of(bias), resolution=8)
    want = command_png(["--scheme", "cable", "--input", str(file), "--kind", "profile"], tmp_path / "cli", capsys)
    with biasviz.open(file) as view:
        figs = view.plot(kind="profile", dpi=DPI)
        assert isinstance(figs, list) and len(figs) == len(want) == 2
        for fig, stem in zip(figs, sorted(want), strict=True):  # bias, then weights: the command's order
            assert np.array_equal(pixels_of(fig), want[stem]), stem
        with pytest.raises(BiasvizError, match="summary file"):
            view.plot(kind="bias", sample=1)


def test_options_are_checked_as_the_command_checks_them(tmp_path: Path, make_bias_file: Callable[..., Path]) -> None:
    file = make_bias_file(tmp_path / "alibi.h5", heads=4, t=16)
    with pytest.raises(UsageError, match="--log applies to attention weights"):
        biasviz.plot(file, kind="bias", log=True)
    with pytest.raises(UsageError, match="kind"):
        biasviz.plot(file, kind="heatmap")
    with pytest.raises(TypeError, match="colour"):
        biasviz.plot(file, colour="red")


@pytest.mark.parametrize("kind", ["bias", "profile", "std"])
def test_no_figure_of_alibi_prints_a_negative_zero(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                   kind: str) -> None:  # fmt: skip
    """ALiBi's diagonal is stored as -0.0 (-m * 0), its colour bars end there: every label reads 0, never -0."""
    import h5py
    from matplotlib.text import Text

    data = make_bias_file(tmp_path / "alibi.h5", "alibi", t=32)
    with h5py.File(data) as f:
        assert np.signbit(f["layer_3/bias"][0, 0, 5, 5])  # the file holds -0.0 on the diagonal
    figures = biasviz.plot(data, kind=kind)
    texts = []
    for fig in figures if isinstance(figures, list) else [figures]:
        fig.canvas.draw()
        texts += [t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text()]
        texts += [t.get_text() for ax in fig.axes for t in ax.get_xticklabels() + ax.get_yticklabels()]  # colour bars
    words = " ".join(texts).replace("\N{MINUS SIGN}", "-").replace("(", " ").replace(",", " ").split()
    assert texts and not [w for w in words if re.fullmatch(r"-0(\.0*)?", w.rstrip(".;:"))], texts
