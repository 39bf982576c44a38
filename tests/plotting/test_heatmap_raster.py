"""Heatmaps keep every drawn cell: one image pixel per cell inside a PDF, at least one pixel per cell in a PNG."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
from matplotlib.image import imread

from biasviz.plotting import head_grid
from biasviz.plotting.save import save_figure


def pdf_image_sizes(pdf: bytes) -> list[tuple[int, int]]:
    """(width, height) of every image XObject of a PDF, from their dictionaries (plain text in the file)."""
    sizes = []
    for obj in re.findall(rb"<<[^>]*?/Subtype\s*/Image[^>]*>>", pdf):
        w, h = re.search(rb"/Width\s+(\d+)", obj), re.search(rb"/Height\s+(\d+)", obj)
        sizes.append((int(w.group(1)), int(h.group(1))))
    return sizes


def stripes(heads: int, t: int) -> np.ndarray:
    """Keys alternate 0 and 1: a panel that drops or merges a column shows it as a missing stripe."""
    return np.broadcast_to((np.arange(t) % 2).astype(np.float32), (heads, t, t)).copy()


def test_a_pdf_holds_every_cell_of_a_512_matrix_whatever_the_dpi(tmp_path: Path) -> None:
    fig = head_grid(stripes(3, 512), kind="bias", style="icml")  # the docs' snippet: 512 cells, a page's width
    fig.savefig(tmp_path / "plain.pdf")  # the user's savefig, at matplotlib's default dpi (100)
    (ours,) = save_figure(fig, tmp_path / "ours", ["pdf"])
    for pdf in (tmp_path / "plain.pdf", ours):
        panels = [s for s in pdf_image_sizes(pdf.read_bytes()) if s[0] > 50]  # colour bars are thin strips
        assert panels == [(512, 512)] * 3, (pdf.name, panels)


def test_plot_pdf_images_are_the_drawn_cells_and_the_png_gives_each_a_pixel(tmp_path: Path) -> None:
    import biasviz
    from tests.cli.test_plot_cmd import write_file

    t = 512
    path = write_file(tmp_path / "alibi.h5", "alibi", stripes(12, t)[None] - 1.0, n=1, t=t)
    fig = biasviz.plot(path, kind="bias", dpi=200)
    ax = next(a for a in fig.axes if a.get_images())
    cells = ax.get_images()[0].get_array().shape[1]
    (pdf,) = save_figure(fig, tmp_path / "b", ["pdf"])
    panels = [s for s in pdf_image_sizes(pdf.read_bytes()) if s[0] > 50]
    assert panels == [(cells, cells)] * 12
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=200)
    png = imread(io.BytesIO(buf.getvalue()))
    scale = png.shape[0] / fig.bbox.height  # pixels of the PNG per display unit
    box = ax.get_window_extent()
    assert box.width * scale >= cells, (box.width * scale, cells)  # the panel has a pixel for every drawn cell


def test_each_stripe_of_a_png_is_there(tmp_path: Path) -> None:
    """Read back the PNG: along the last query row of head 1 (every key visible), 150 alternating cells give 150
    runs of colour when each cell has a pixel or more."""
    t = 150
    fig = head_grid(stripes(3, t), kind="bias", style="icml", causal=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=300)
    png = imread(io.BytesIO(buf.getvalue()))[..., :3]
    ax = next(a for a in fig.axes if a.get_images())
    fig.canvas.draw()
    box = ax.get_window_extent()
    scale = png.shape[0] / fig.bbox.height
    row = int(png.shape[0] - (box.y0 + 2) * scale)  # just inside the panel's bottom edge
    x0, x1 = int(np.ceil(box.x0 * scale)) + 1, int(box.x1 * scale) - 1
    line = png[row, x0:x1]
    runs = 1 + int(np.any(np.abs(np.diff(line, axis=0)) > 0.1, axis=1).sum())
    assert runs == t, runs
