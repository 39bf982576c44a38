"""docs/paper-figures.md: the widths it gives, and fonts embedded as TrueType, read from the PDF bytes themselves."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import run_cli

POINTS = 72  # PDF units an inch


def pdf_facts(path: Path) -> tuple[float, bool, bool]:
    """(width in inches from the MediaBox, a TrueType font file embedded, any Type 3 font)."""
    raw = path.read_bytes()
    box = [float(x) for x in re.search(rb"/MediaBox \[ *([\d. ]+)\]", raw).group(1).split()]
    return (box[2] - box[0]) / POINTS, b"/FontFile2" in raw, b"/Type3" in raw


@pytest.mark.parametrize(("width", "inches"), [("column", 3.25), ("page", 6.75)])
def test_command_and_notebook_pdfs_have_the_width_and_embedded_truetype_fonts(
        width: str, inches: float, tmp_path: Path, make_bias_file: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    import biasviz

    data = make_bias_file(tmp_path / "alibi.h5", "alibi", heads=4, t=32)
    code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(data), "--style", "icml", "--width", width,
                            "--format", "pdf", "--out-dir", str(tmp_path / "cmd")], capsys)  # fmt: skip
    assert code == 0, err
    biasviz.plot(data, kind="bias", style="icml", width=width).savefig(tmp_path / "nb.pdf")
    for pdf in (tmp_path / "cmd" / "alibi_bias.pdf", tmp_path / "nb.pdf"):
        got, truetype, type3 = pdf_facts(pdf)
        assert got == pytest.approx(inches, abs=1e-3) and truetype and not type3, (pdf, got, truetype, type3)


def test_the_page_states_the_widths_the_styles_have() -> None:
    from biasviz.plotting.style import VENUE_WIDTHS

    page = (Path(__file__).resolve().parents[2] / "docs" / "paper-figures.md").read_text()
    for style, inches in VENUE_WIDTHS.items():
        venue = style.removesuffix("-column")
        said = f"--style {venue} --width column` ({inches:g} in)" if style.endswith("-column") else f"({inches:g} in"
        assert said in page, (style, said)
