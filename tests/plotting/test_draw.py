"""``biasviz plot`` as a library call (:mod:`biasviz.plotting.draw`): options checked in the command's words before any
file is read, the scheme and input resolved as ``--scheme`` and ``--input`` resolve them, and the figures kept, with
their style and caption, instead of written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.image as mpimg
import numpy as np
import pytest
from matplotlib.figure import Figure

from biasviz.common.errors import BiasvizError, UsageError
from biasviz.plotting.draw import check_option, figures, keeping, plot_scheme
from tests.conftest import run_cli
from tests.notebook.test_notebook_library_path import DPI, small  # noqa: F401  (small: fixture)


@pytest.mark.parametrize(("option", "value"), [
    ("kind", "bias"), ("kind", "dynamics"), ("normalize", "none"), ("normalize", "diagonal"), ("reduce", "mean"),
    ("reduce", "max"), ("style", "neurips"), ("style", "icml-column"), ("dpi", 50), ("dpi", 1200),
    ("max-cells", None), ("max-cells", 16), ("max-cells", 10_000), ("cmap", "no such map"),  # taken as it is
])  # fmt: skip
def test_a_value_an_option_takes_passes(option: str, value: Any) -> None:
    check_option(option, value)


@pytest.mark.parametrize(("option", "value", "message"), [
    ("kind", "heatmap", "Invalid value for '--kind': 'heatmap' is not one of 'bias', 'weights', 'all', "),
    ("normalize", "row", "Invalid value for '--normalize': 'row' is not one of 'none', 'diagonal'."),
    ("reduce", "median", "Invalid value for '--reduce': 'median' is not one of 'mean', 'max'."),
    ("style", "nature", "Invalid value for '--style': 'nature' is not one of 'neurips', "),
    ("dpi", 49, "Invalid value for '--dpi': 49 is not in the range 50<=x<=1200."),
    ("dpi", 1201, "Invalid value for '--dpi': 1201 is not in the range 50<=x<=1200."),
    ("max-cells", 15, "Invalid value for '--max-cells': 15 is not in the range 16<=x<=10000."),
    ("max-cells", 10_001, "Invalid value for '--max-cells': 10001 is not in the range 16<=x<=10000."),
])  # fmt: skip
def test_a_value_an_option_does_not_take_is_the_commands_usage_error(option: str, value: Any, message: str) -> None:
    with pytest.raises(UsageError) as exc:
        check_option(option, value)
    assert str(exc.value).startswith(message)


def test_the_scheme_and_the_input_as_the_options_give_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           make_bias_file: Callable[..., Path]) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match=r"give --scheme, --input or both"):
        plot_scheme(None, None)
    assert plot_scheme("KERPLE", None) == ("kerple-log", Path("data/kerple-log.h5"))  # an alias, in data/
    assert plot_scheme(" t5-bias ", Path("x.h5")) == ("t5", Path("x.h5"))
    path = make_bias_file(tmp_path / "m.h5", "cable", n=1, heads=1, t=4)
    assert plot_scheme(None, path) == ("cable", path)  # the scheme the file records
    assert plot_scheme(" llama ", path) == ("llama", path)  # a traced model's name, where its file is there
    with pytest.raises(BiasvizError, match="unknown scheme 'llama'"):
        plot_scheme("llama", None)  # no data/llama.h5
    (tmp_path / "data").mkdir()
    make_bias_file(tmp_path / "data" / "llama.h5", "cable", n=1, heads=1, t=4)
    assert plot_scheme("llama", None) == ("llama", Path("data/llama.h5"))
    with pytest.raises(BiasvizError, match="unknown scheme"):
        plot_scheme("a/b", path)  # a name that cannot name a file


def test_a_kept_figure_writes_nothing_and_carries_its_caption() -> None:
    kept: list[tuple[Figure, str | None]] = []
    sink = keeping(kept)
    first, second = Figure(), Figure()
    assert sink(first, Path("out/a"), ["png"], "\\caption{A}", {"style": "icml", "dpi": 72}) == []
    assert sink(second, Path("out/b"), ["pdf"], None, {}) == []
    assert kept == [(first, "icml"), (second, "neurips")]  # without a style: the default one
    assert (first.biasviz_caption, second.biasviz_caption) == ("\\caption{A}", None)
    assert not Path("out").exists()


def test_options_are_checked_before_the_file_is_read(tmp_path: Path) -> None:
    missing = tmp_path / "none.h5"
    with pytest.raises(UsageError, match="'--kind': 'heatmap'"):
        figures(missing, "heatmap")
    with pytest.raises(UsageError, match="'--dpi': 20"):
        figures(missing, dpi=20)
    with pytest.raises(BiasvizError, match=r"none\.h5 does not exist"):
        figures(missing, scheme="alibi")


def test_a_figure_is_kept_in_the_style_and_width_asked_for(small: Path) -> None:  # noqa: F811
    ((fig, _),) = figures(small, "weights", style="icml", width="column", dpi=50, max_cells=16)
    assert fig.get_size_inches()[0] == pytest.approx(3.25)  # ICML's column
    images = [ax.get_images()[0].get_array() for ax in fig.axes if ax.get_images()]
    assert len(images) == 4  # one panel per head
    assert "\\caption{Attention weights" in fig.biasviz_caption


def test_the_librarys_figures_are_the_commands_pngs(small: Path, tmp_path: Path,  # noqa: F811
                                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """``biasviz.plotting.draw.figures``, saved as the command saves (its style, no --caption), gives its pixels."""
    from biasviz.plotting.draw import figures
    from biasviz.plotting.save import save_figure

    code, _, err = run_cli(["plot", "--input", str(small), "--kind", "all", "--sample", "2", "--format", "png",
                            "--dpi", str(DPI), "--out-dir", str(tmp_path / "cli")], capsys)  # fmt: skip
    assert code == 0, err
    kept = figures(small, "all", sample=2, dpi=DPI)
    assert [style for _, style in kept] == ["neurips", "neurips"]
    for (fig, style), kind in zip(kept, ("bias", "weights"), strict=True):
        (written,) = save_figure(fig, tmp_path / "lib" / kind, ["png"], dpi=DPI, style=style)
        want = mpimg.imread(tmp_path / "cli" / f"cable_{kind}.png")
        assert np.array_equal(mpimg.imread(written), want), kind
        assert "\\caption{" in fig.biasviz_caption
