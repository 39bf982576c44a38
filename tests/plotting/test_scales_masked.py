"""Masked cells (a key after its query) have their own neutral colour, and a value of 0 never looks masked.

Checked on the rendered pixels: a figure drawn by ``plot`` (PNG, read back with matplotlib) and the explorer's
canvas in a headless browser, both on a diverging map where values near 0 are white.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl
import numpy as np
import pytest

from biasviz.plotting.heatmap import head_grid
from biasviz.plotting.scales import DEFAULT_CMAPS, MASKED_DISTANCE, masked_color
from tests.explorer.test_build import page_payload

T = 16


def _signed_bias() -> np.ndarray:
    """(2, T, T): head 1 changes sign with many cells exactly 0 (a diverging map: white), head 2 is all >= 0."""
    d = np.subtract.outer(np.arange(T), np.arange(T)).astype(np.float64)
    first = np.where(d % 3 == 0, 0.0, np.sin(d))
    return np.stack([first, d / T])


@pytest.mark.parametrize("name", sorted(set(DEFAULT_CMAPS.values())))
def test_no_value_of_a_default_map_comes_near_the_masked_colour(name: str) -> None:
    cmap = mpl.colormaps[name]
    table = cmap(np.linspace(0, 1, 4096))[:, :3]
    assert np.min(np.linalg.norm(table - np.asarray(masked_color(cmap)), axis=1)) >= MASKED_DISTANCE


def test_a_drawn_grid_paints_masked_cells_grey_and_no_data_cell_so(tmp_path: Path) -> None:
    fig = head_grid(_signed_bias(), kind="bias", max_cells=T)
    fig.canvas.draw()
    upper = np.triu(np.ones((T, T), bool), 1)
    for ax in fig.axes:
        if not ax.images or ax.get_label() == "<colorbar>":
            continue
        image = ax.images[0]
        rgba = image.to_rgba(image.get_array())[..., :3]  # the colours the panel is drawn with, per cell
        grey = np.asarray(masked_color(image.get_cmap()))
        assert np.abs(rgba[upper] - grey).max() < 1e-6
        assert np.min(np.linalg.norm(rgba[~upper] - grey, axis=-1)) >= MASKED_DISTANCE
    path = tmp_path / "grid.png"
    fig.savefig(path, dpi=100)
    pixels = mpl.image.imread(path)[..., :3]
    grey = np.asarray(masked_color(mpl.colormaps[DEFAULT_CMAPS["diverging"]]))
    assert (np.linalg.norm(pixels - grey, axis=-1) < 0.02).sum() > 50  # the grey is on the page, not blank


def test_the_explorer_paints_masked_cells_in_the_figures_colour(tmp_path: Path,
                                                               make_bias_file) -> None:  # noqa: ANN001  # fmt: skip
    shutil = pytest.importorskip("shutil")
    chromium = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    if chromium is None or shutil.which("chromedriver") is None:
        pytest.skip("needs chromium and chromedriver")
    webdriver = pytest.importorskip("selenium.webdriver")
    import biasviz

    src = make_bias_file(tmp_path / "t5.h5", "t5", heads=3, t=32)
    page = tmp_path / "page.html"
    biasviz.explore(src, kind="bias").save(page)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(arg)
    drv = webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)
    try:
        drv.get(page.as_uri())
        for _ in range(500):
            if drv.execute_script("return document.body.dataset.ready === '1'"):
                break
        got = drv.execute_script("""
            const c = document.querySelector('canvas[data-head="1"]'), ctx = c.getContext('2d');
            const at = (fy, fx) => Array.from(ctx.getImageData(Math.floor(fx * c.width), Math.floor(fy * c.height),
                                                               1, 1).data);
            return {masked: at(0.1, 0.9), lower: at(0.9, 0.1)};
        """)
    finally:
        drv.quit()
    payload = page_payload(page.read_text())
    cmap = payload["sets"][next(iter(payload["sets"]))]["scale"]["head"][0][2]
    want = [round(255 * c) for c in masked_color(mpl.colormaps[cmap])]
    assert got["masked"][:3] == want and got["masked"][3] == 255
    assert np.linalg.norm(np.asarray(got["lower"][:3]) - want) > 255 * MASKED_DISTANCE / 2
