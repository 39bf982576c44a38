"""Figures written by :mod:`biasviz.plotting.save`: raster heatmaps with vector text in a PDF, and the provenance in
every format's metadata."""

from __future__ import annotations

import re

from biasviz.plotting.heatmap import head_grid
from biasviz.plotting.save import parse_formats, save_figure
from tests.plotting.test_heatmap import alibi


def test_pdf_has_raster_heatmaps_vector_text_and_metadata(tmp_path) -> None:
    fig = head_grid(alibi(12, t=128))
    (pdf,) = save_figure(fig, tmp_path / "alibi_bias", ["pdf"], info={"description": "reduction: none"})
    data = pdf.read_bytes()
    assert len(re.findall(rb"/Subtype\s*/Image", data)) >= 12
    assert b"/FontFile2" in data  # embedded TrueType: text stays text
    assert b"reduction: none" in data
    assert not list(tmp_path.glob(".*tmp"))


def test_png_and_svg_carry_metadata(tmp_path) -> None:
    fig = head_grid(alibi(3, t=32))
    png, svg = save_figure(fig, tmp_path / "x", parse_formats("png,svg"), dpi=72, info={"source": "data/x.h5"})
    assert b"data/x.h5" in png.read_bytes() and b"<text" in svg.read_bytes()


def test_a_figure_saved_in_two_formats_is_laid_out_once_and_drawn_once_a_file(tmp_path, monkeypatch) -> None:
    """Constrained layout runs once for both files, and each file draws the figure once: no draw before each file to
    lay out what is laid out (matplotlib's placeholder engine asks for one); the engine back in place afterwards."""
    from matplotlib.figure import Figure

    drawn = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: drawn.append(renderer) or draw(fig, renderer))
    fig = head_grid(alibi(3, t=32))
    engine = fig.get_layout_engine()
    drawn.clear()
    pdf, png = save_figure(fig, tmp_path / "both", ["pdf", "png"], dpi=72)
    assert len(drawn) == 3, [type(r).__name__ for r in drawn]  # the layout, the PDF, the PNG
    assert fig.get_layout_engine() is engine
    assert pdf.read_bytes().startswith(b"%PDF") and png.read_bytes().startswith(b"\x89PNG")
