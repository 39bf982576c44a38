"""``--width column|page|INCHES``: the printed width a figure is drawn at, with every text at least 6 pt there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from matplotlib.text import Text

from biasviz.common.errors import BiasvizError
from biasviz.plotting.style import VENUE_WIDTHS, venue_width, with_width
from tests.conftest import run_cli


@pytest.fixture(scope="module")
def file(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Any) -> Path:
    return make_bias_file(tmp_path_factory.mktemp("width") / "alibi.h5", "alibi", n=2, t=64)


#: (--style, --width, the printed width in inches): every way --width is read (a venue's column, its page, inches as a
#: bare number and with "in"), at one and two-column venues, on both sides of font_sizes' 4 in step
WIDTHS = [
    ("icml", "column", VENUE_WIDTHS["icml-column"]),
    ("icml-column", "page", VENUE_WIDTHS["icml"]),
    ("acl", "column", VENUE_WIDTHS["acl-column"]),
    ("neurips", "3.5", 3.5),
    ("neurips", "2", 2.0),
    ("icml", "7.25in", 7.25),
]
#: The widths each command draws at: one of each way --width is read, so that every branch of with_width reaches a
#: figure, with the narrowest allowed (2 in: the most crowded figure, fonts one step smaller) and the widest asked.
#: The two left out, icml's column (3.25 in) and 3.5 in, repeat acl's column (3.0 in) and 2 in: the same branch
#: of with_width, the same font sizes (font_sizes: below 4 in) and more room; the widths they ask are checked in
#: test_every_width_asked_is_the_width_the_style_prints.
DRAWN = [WIDTHS[1], WIDTHS[2], WIDTHS[4], WIDTHS[5]]


@pytest.mark.parametrize(("style", "width", "inches"), WIDTHS)
def test_every_width_asked_is_the_width_the_style_prints(style: str, width: str, inches: float) -> None:
    """What ``--style STYLE --width WIDTH`` becomes is drawn at ``inches``: the style the commands draw with."""
    assert venue_width(with_width(style, width)) == pytest.approx(inches)


@pytest.mark.parametrize(("style", "width", "inches"), DRAWN)
@pytest.mark.parametrize("command", ["plot", "diagnose"])
def test_the_figure_is_drawn_at_the_width_asked_with_no_text_below_6_pt(
    file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], figures: dict[str, Any], style: str,
    width: str, inches: float, command: str,
) -> None:  # fmt: skip
    args = (["plot", "--scheme", "alibi", "--input", str(file)] if command == "plot"
            else ["diagnose", str(file), "--json", str(tmp_path / "d.json")])  # fmt: skip
    code, _, err = run_cli([*args, "--style", style, "--width", width, "--format", "png", "--out-dir",
                            str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    fig = figures["alibi_bias" if command == "plot" else "diagnostics"]
    assert fig.get_figwidth() == pytest.approx(inches)
    fig.canvas.draw()
    sizes = {t.get_fontsize() for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()}
    assert sizes and min(sizes) >= 6.0, sorted(sizes)


@pytest.mark.parametrize(("style", "width", "message"), [
    ("neurips", "column", "neurips prints one column"),
    ("icml", "wide", "column, page or a width in inches"),
    ("icml", "1.5", "from 2 to 10 inches"),
    ("icml", "12in", "from 2 to 10 inches"),
])  # fmt: skip
def test_a_width_that_cannot_be_is_one_error_line(file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  style: str, width: str, message: str) -> None:  # fmt: skip
    with pytest.raises(BiasvizError, match=message):
        with_width(style, width)
    code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(file), "--style", style, "--width", width,
                            "--out-dir", str(tmp_path / "out")], capsys)  # fmt: skip
    lines = [line for line in err.splitlines() if line.strip()]
    assert code != 0 and len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], err
    assert not (tmp_path / "out").exists()


def test_no_figures_refuses_a_width(file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["diagnose", str(file), "--no-figures", "--width", "column", "--json",
                            str(tmp_path / "d.json")], capsys)  # fmt: skip
    assert code != 0 and "--width" in err
