"""Saved PDFs embed TrueType (or Type 1) fonts that poppler lists and renders without a warning.

Publishers' checks read `pdffonts`; a CFF font embedded as TrueType ("CID Type 0C", what a system Nimbus Roman gave)
makes `pdftoppm` warn "Mismatch between font type and embedded font file". Needs poppler-utils; skips without it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from matplotlib import font_manager
from matplotlib.figure import Figure

from biasviz.cli import cli
from biasviz.plotting.save import save_figure
from biasviz.plotting.style import paper_context
from tests.cli.test_plot_cmd import _alibi, write_file

needs_poppler = pytest.mark.skipif(not (shutil.which("pdffonts") and shutil.which("pdftoppm")),
                                   reason="poppler-utils (pdffonts, pdftoppm) not installed")  # fmt: skip
CLEAN_TYPES = {"TrueType", "CID TrueType", "Type 1"}


def pdf_fonts(pdf: Path) -> list[tuple[str, str, str]]:
    """(name, type, embedded) of each font `pdffonts` lists, read by the columns of its header's dashes."""
    lines = subprocess.run(["pdffonts", str(pdf)], capture_output=True, text=True, check=True).stdout.splitlines()
    dashes = lines[1].split(" ")
    bounds, start = [], 0
    for dash in dashes:
        bounds.append((start, start + len(dash)))
        start += len(dash) + 1
    rows = [[line[a:b].strip() for a, b in bounds] for line in lines[2:] if line.strip()]
    return [(row[0], row[1], row[3]) for row in rows]


def check_clean(pdf: Path) -> None:
    fonts = pdf_fonts(pdf)
    assert fonts, "no font listed: the text was not kept as text"
    for name, kind, embedded in fonts:
        assert kind in CLEAN_TYPES and embedded == "yes", (name, kind, embedded)
    render = subprocess.run(["pdftoppm", "-r", "150", "-png", str(pdf), str(pdf.with_suffix(""))],
                            capture_output=True, text=True)  # fmt: skip
    assert render.returncode == 0 and render.stderr == "", render.stderr


@needs_poppler
def test_plot_pdf_fonts_are_truetype_embedded_and_render_cleanly(tmp_path: Path) -> None:
    path = write_file(tmp_path / "alibi.h5", "alibi", _alibi(2))
    result = CliRunner().invoke(cli, ["plot", "--scheme", "alibi", "--input", str(path), "--kind", "all",
                                      "--format", "pdf", "--out-dir", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("alibi_bias.pdf", "alibi_weights.pdf"):
        check_clean(tmp_path / name)


@needs_poppler
def test_math_and_unicode_text_embed_the_same_clean_fonts(tmp_path: Path) -> None:
    with paper_context("icml-column"):
        fig = Figure(figsize=(3.25, 1.5))
        ax = fig.add_subplot()
        ax.set_title(r"$b_h(i, j) \leq 0$, $\sqrt{d}$ and P(d = 0) − 3 ≥ 2 × 1")
        ax.plot([0, 1], [-1, 1])
    save_figure(fig, tmp_path / "math", ["pdf"])
    check_clean(tmp_path / "math.pdf")
    names = {name.split("+", 1)[-1] for name, _, _ in pdf_fonts(tmp_path / "math.pdf")}
    assert all(n.startswith("STIX") for n in names), names  # text and math in one face


def test_the_text_face_has_truetype_outlines() -> None:
    """Whatever fonts the machine has, the face the paper style names resolves to a TrueType file (first bytes
    0x00010000 or 'true'; a CFF font starts 'OTTO')."""
    import matplotlib as mpl

    with paper_context("neurips"):
        family = mpl.rcParams["font.family"]
        path = font_manager.findfont(font_manager.FontProperties(family=family), fallback_to_default=False)
    assert Path(path).read_bytes()[:4] in (b"\x00\x01\x00\x00", b"true"), path


def test_cff_font_files_are_told_from_truetype_ones(tmp_path: Path) -> None:
    from biasviz.plotting.style import truetype_outlines

    cff, ttf, ttc = tmp_path / "a.otf", tmp_path / "b.ttf", tmp_path / "c.ttc"
    cff.write_bytes(b"OTTO" + bytes(60))  # OpenType with CFF outlines (the OpenType spec's sfntVersion)
    ttf.write_bytes(b"\x00\x01\x00\x00" + bytes(60))
    ttc.write_bytes(b"ttcf" + bytes(8) + (16).to_bytes(4, "big") + b"OTTO" + bytes(40))  # a collection of CFF fonts
    assert [truetype_outlines(str(p)) for p in (cff, ttf, ttc, tmp_path / "missing")] == [False, True, False, False]
