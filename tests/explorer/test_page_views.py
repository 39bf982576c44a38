"""The explorer's views in a real headless browser (chromium through selenium): what stays on screen, the
enlarged head, checkpoint sweeps, the difference of two files and the exported images.

Expected values come from the HDF5 files through h5py and from matplotlib's own colour maps.
"""

from __future__ import annotations

import base64
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

from tests.explorer.test_build import STEPS, SWEEP_T, write_sweep

pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install -e '.[dev]')")
from tests.explorer.test_page_browser import (  # noqa: F401  (driver: fixture)
    choose,
    console_errors,
    driver,
    hover,
    open_page,
    pixels,
    redraw,
    wait_for,
)

By = pytest.importorskip("selenium.webdriver.common.by").By

import biasviz  # noqa: E402


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("views")
    cable = make_bias_file(root / "cable.h5", "cable", n=2, t=64)
    sweep = write_sweep(root / "sweep.h5")
    out = {"cable": cable, "sweep": sweep}
    for name, args in {"page": (cable,), "same": (cable, cable), "sweep_page": (sweep,)}.items():
        out[name] = biasviz.explore(*args).save(root / f"{name}.html")
    return out


@pytest.fixture()
def window(driver: object) -> Iterator[Callable[[int, int], None]]:  # noqa: F811
    """Set the viewport to width x height CSS pixels (as the README's screenshots are taken); reset after."""

    def size(width: int, height: int) -> None:
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                               {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip

    yield size
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


def rect(drv: object, css: str) -> dict[str, float]:
    return drv.execute_script(f"const r = document.querySelector('{css}').getBoundingClientRect();"
                              "return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}")  # fmt: skip


def pixel(drv: object, css: str, x: int, y: int) -> list[int]:
    """RGBA of one canvas pixel (canvas coordinates)."""
    return drv.execute_script(
        f"return Array.from(document.querySelector('{css}').getContext('2d').getImageData({x}, {y}, 1, 1).data)")


def test_twelve_heads_fit_1400_by_900_and_the_readout_stays_in_view(
    driver: object,  # noqa: F811
    pages: dict[str, Path],
    window: Callable[[int, int], None],
) -> None:
    window(1400, 900)
    open_page(driver, pages["page"])
    assert rect(driver, '#grid .panel[data-panel="12"]')["bottom"] <= 900, "12 heads must fit without scrolling"
    window(900, 600)  # a smaller window: the page scrolls, the controls and the read-out stay
    redraw(driver, lambda: driver.execute_script("window.dispatchEvent(new Event('resize')); "
                                                 "document.getElementById('shared').click()"))  # fmt: skip
    last = driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="12"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'end'})", last)
    assert driver.execute_script("return window.scrollY") > 200
    text = hover(driver, last, 40, 10)
    assert "head 12 · query i = 40 · key j = 10" in text
    assert driver.execute_script("return window.scrollY") > 200
    box = rect(driver, "#readout")
    assert box["top"] >= 0 and box["bottom"] <= 600, box
    controls = rect(driver, "#controls")
    assert controls["top"] >= 0 and controls["bottom"] <= 600, controls
    assert console_errors(driver) == []


def test_twelve_pairs_of_a_and_b_fit_1400_by_900_each_pair_captioned(
    driver: object,  # noqa: F811
    pages: dict[str, Path],
    window: Callable[[int, int], None],
) -> None:
    window(1400, 900)
    open_page(driver, pages["same"])
    choose(driver, "source", "AB")
    assert rect(driver, '#grid .panel[data-panel="12"]')["bottom"] <= 900, "12 pairs must fit without scrolling"
    for head in (1, 12):
        a, b = driver.find_elements(By.CSS_SELECTOR, f'#grid .panel[data-panel="{head}"] canvas[data-head]')[:2]
        assert (a.get_attribute("data-source"), b.get_attribute("data-source")) == ("A", "B")
        assert a.rect["x"] < b.rect["x"] and a.rect["width"] >= 120  # side by side, each large enough to read
        caption = driver.find_element(By.CSS_SELECTOR, f'#grid .panel[data-panel="{head}"] figcaption').text
        assert caption == f"Head {head} · A | B"
    assert console_errors(driver) == []


def test_the_enlarged_head_opens_at_its_top_with_its_colorbar_axes_and_zoom_scale(driver: object,  # noqa: F811
                                                                                  pages: dict[str, Path]) -> None:
    open_page(driver, pages["page"])
    last = driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="12"]')
    driver.execute_script("arguments[0].scrollIntoView({block: 'end'})", last)
    redraw(driver, last.click)
    wait_for(driver, "return window.scrollY === 0")
    assert driver.find_element(By.ID, "focus").is_displayed()
    for css in ("#focus-cbar", ".fplot .xaxis", ".fplot .yaxis", "#profile"):
        drawn = driver.execute_script(  # something is drawn: not every pixel blank
            f"const c = document.querySelector('{css}'); const d = c.getContext('2d')"
            ".getImageData(0, 0, c.width, c.height).data; return d.some((v, k) => k % 4 === 3 && v > 0)")
        assert drawn, css
    canvas = driver.find_element(By.CSS_SELECTOR, "#focus-canvases canvas")
    size = driver.execute_script("return arguments[0].clientWidth", canvas)
    before = pixels(driver, "#focus-cbar")
    assert driver.find_element(By.CSS_SELECTOR, ".fplot .xaxis").get_attribute("data-labels") == "positions"

    def drag() -> None:
        from selenium.webdriver.common.action_chains import ActionChains

        a, b = (round((k + 0.5) * size / 64 - size / 2) for k in (40, 55))
        ActionChains(driver).move_to_element_with_offset(canvas, a, a).click_and_hold()\
            .move_to_element_with_offset(canvas, b, b).release().perform()  # fmt: skip

    redraw(driver, drag)
    zoomed = pixels(driver, "#focus-canvases canvas")
    # 16 x 16 cells: each wide enough to read its token on the axes
    assert driver.find_element(By.CSS_SELECTOR, ".fplot .xaxis").get_attribute("data-labels") == "tokens"
    assert pixels(driver, "#focus-cbar") != before, "the colour bar follows the zoomed region's range"
    redraw(driver, lambda: driver.find_element(By.ID, "zoom-scale").click())
    assert pixels(driver, "#focus-canvases canvas") != zoomed, "the toggle goes back to the whole head's colours"
    assert pixels(driver, "#focus-cbar") == before
    assert console_errors(driver) == []


def test_the_step_selector_of_a_sweep_changes_what_is_drawn_and_read(driver: object,  # noqa: F811
                                                                     pages: dict[str, Path]) -> None:
    open_page(driver, pages["sweep_page"])
    options = driver.execute_script("return Array.from(document.querySelectorAll('#step option'), "
                                    "(o) => [o.value, o.textContent, o.selected])")  # fmt: skip
    assert options == [["0", "step 0", False], ["1", "step 50", False], ["2", "step 200", True]]
    assert "step 200" in driver.find_element(By.ID, "where").text
    assert "layer 1 · sample 0 · bias" in driver.find_element(By.ID, "where").text
    first = '#grid canvas[data-head="2"]'
    seen = {pixels(driver, first)}
    for step in ("0", "1"):
        choose(driver, "step", step)
        seen.add(pixels(driver, first))
        where = driver.find_element(By.ID, "where").text
        assert f"step {STEPS[int(step)]} (checkpoint {int(step)} of 3, from 0)" in where
    assert len(seen) == 3, "each checkpoint draws its own matrices"
    choose(driver, "sample", "1")
    text = hover(driver, driver.find_element(By.CSS_SELECTOR, first), 20, 7, region=(0, SWEEP_T, 0, SWEEP_T))
    with h5py.File(pages["sweep"]) as f:
        value = f["layer_1/bias"][1, 1, 1, 20, 7]
    assert f"value {float(value):.4g} (exact)" in text, text
    assert console_errors(driver) == []


def test_the_difference_of_identical_files_is_drawn_as_0_at_the_foot_of_a_sequential_map(driver: object,  # noqa: F811
                                                                                        pages: dict[str, Path]) -> None:
    import matplotlib as mpl

    open_page(driver, pages["same"])
    choose(driver, "source", "D")
    centre = list(mpl.colormaps["viridis"](0.0, bytes=True))  # all 0: one sign, a scale from 0 to 1 (the figures')
    css = '#grid canvas[data-head="3"]'
    side = driver.execute_script(f"return document.querySelector('{css}').width")
    for x, y in ((5, side - 5), (side // 2, side - 3), (3, side // 2)):  # below the diagonal: used cells
        assert pixel(driver, css, x, y) == centre
    from biasviz.plotting.scales import masked_color

    masked = [round(255 * c) for c in masked_color(mpl.colormaps["viridis"])]
    assert pixel(driver, css, side - 5, 5) == [*masked, 255], "masked cells: the figures' neutral colour, not 0's"
    text = hover(driver, driver.find_element(By.CSS_SELECTOR, css), 50, 20)
    assert "A - B · head 3" in text and "value 0 (exact)" in text, text
    caption = driver.find_element(By.CSS_SELECTOR, '#grid .panel[data-panel="3"] figcaption').text
    assert "A - B" in caption
    redraw(driver, driver.find_element(By.CSS_SELECTOR, css).click)
    label = driver.find_element(By.CSS_SELECTOR, ".fplot-label").text
    assert label.startswith("A - B = ") and " minus " in label
    # the bar's ends say what is there: every cell equal (its 1 is room, no value), never "A larger" / "B larger"
    assert driver.find_element(By.ID, "focus-cbar").get_attribute("data-ends") == "A = B|"
    assert console_errors(driver) == []


def test_a_difference_of_one_sign_labels_only_the_end_it_reaches(driver: object, tmp_path: Path) -> None:  # noqa: F811
    """A - B >= 0 everywhere (B is A less a positive amount): the top of the bar says A larger, the bottom does not
    say B larger; where A - B changes sign, each end says its own."""
    from tests.cli.test_plot_cmd import _alibi, write_file

    a = _alibi(2)
    b = a - 0.25 - np.abs(np.random.default_rng(0).normal(size=a.shape)).astype(np.float32)
    mixed = a + np.random.default_rng(1).normal(size=a.shape).astype(np.float32)
    pa, pb, pm = (write_file(tmp_path / f"{n}.h5", "alibi", x) for n, x in (("a", a), ("b", b), ("m", mixed)))
    for other, want in ((pb, "|A larger"), (pm, "B larger|A larger")):
        page = biasviz.explore(pa, other).save(tmp_path / f"{other.stem}.html")
        open_page(driver, page)
        choose(driver, "source", "D")
        redraw(driver, driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="2"]').click)
        assert driver.find_element(By.ID, "focus-cbar").get_attribute("data-ends") == want
    assert console_errors(driver) == []


def test_the_view_exports_as_png_and_svg(driver: object, pages: dict[str, Path]) -> None:  # noqa: F811
    open_page(driver, pages["page"])
    script = ("const done = arguments[arguments.length - 1]; window.biasviz.exportView(arguments[0])"
              ".then((b) => b.arrayBuffer()).then((a) => { let s = ''; new Uint8Array(a).forEach((c) => {"
              " s += String.fromCharCode(c); }); done(btoa(s)); });")  # fmt: skip
    png = base64.b64decode(driver.execute_async_script(script, "png"))
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    grid = rect(driver, "#grid")
    assert width == pytest.approx(grid["right"] - grid["left"] + 24, abs=2) and height > grid["bottom"] - grid["top"]
    svg = ET.fromstring(base64.b64decode(driver.execute_async_script(script, "svg")))
    ns = "{http://www.w3.org/2000/svg}"
    images = svg.findall(f"{ns}image")
    assert len(images) == 24  # 12 heads and their 12 colour bars
    assert all(im.get("href", "").startswith("data:image/png;base64,") for im in images)
    texts = [t.text for t in svg.findall(f"{ns}text")]
    assert "Head 12" in texts and any(t and "layer 3 · sample 0 · bias" in t for t in texts), texts
    assert driver.execute_script("return document.querySelectorAll('svg, a[download]').length") == 0
    assert console_errors(driver) == []


def test_weights_never_scale_or_band_below_zero(driver: object, pages: dict[str, Path]) -> None:  # noqa: F811
    """A zoomed region holding one value (an all-zero corner of the weights) keeps the whole head's scale, not a
    range around it reaching below 0; the weights' distance profile stops its ±std band at 0."""
    open_page(driver, pages["page"])
    base = driver.execute_script("return biasviz.scaleOver([0, 0.8, 'viridis'], {lo: 0, hi: 0, positive: Infinity})")
    assert base == [0, 0.8, "viridis"]
    zoomed = driver.execute_script("return biasviz.scaleOver([0, 0.8, 'viridis'], {lo: 0.1, hi: 0.3, positive: 0.1})")
    assert zoomed[:2] == [0.1, 0.3]
    labels = driver.execute_script("""
        const texts = [], fill = CanvasRenderingContext2D.prototype.fillText;
        CanvasRenderingContext2D.prototype.fillText = function (t, x, y) { texts.push(String(t)); };
        const cv = document.createElement('canvas'); cv.width = 600; cv.height = 300;
        const {state, drawProfile} = biasviz, kind = state.kind;
        const profile = {mean: [0.1, 0.05, 0.02, 0.01], std: [3, 3, 3, 3], d0: 0};
        try {
          state.kind = 'weights'; drawProfile(cv, [profile], ['A'], 1); const weights = texts.splice(0);
          state.kind = 'bias'; drawProfile(cv, [profile], ['A'], 1); return [weights, texts.splice(0)];
        } finally { state.kind = kind; CanvasRenderingContext2D.prototype.fillText = fill; }""")
    numbers = [[float(t.replace("\u2212", "-")) for t in texts if t.replace("\u2212", "-").lstrip("-")
                .replace(".", "", 1).isdigit()] for texts in labels]  # fmt: skip
    assert min(numbers[0]) >= 0, labels[0]  # the weights' value axis starts at 0
    assert min(numbers[1]) < 0, repr(labels[1])  # the same numbers as a bias: the band goes below 0


BAR_TEXT = """window.barText = [];  // what the enlarged head's colour bar writes: text and its ink box (canvas pixels)
if (!window.barHooked) {
  window.barHooked = true;
  const fill = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    if (this.canvas.id === 'focus-cbar') {
      const m = this.measureText(text);
      window.barText.push([String(text), x - m.actualBoundingBoxLeft, y - m.actualBoundingBoxAscent,
                           x + m.actualBoundingBoxRight, y + m.actualBoundingBoxDescent]);
    }
    return fill.call(this, text, x, y, ...rest);
  };
}"""

RAMP = """const cv = document.getElementById('focus-cbar');  // the ramp: the longest run of opaque rows at x = 12
const d = cv.getContext('2d').getImageData(12, 0, 1, cv.height).data;
let best = [0, 0], start = null;
for (let y = 0; y <= cv.height; y++) {
  const solid = y < cv.height && d[4 * y + 3] === 255;
  if (solid && start === null) start = y;
  if (!solid && start !== null) { if (y - start > best[1] - best[0]) best = [start, y]; start = null; }
}
return [best, cv.width, cv.height];"""


def _read_focus_bar(drv: object, head: int) -> tuple[str, list[list], tuple[int, int], tuple[int, int]]:
    """Enlarge ``head``: the bar's data-limits, the texts it drew with their boxes, its ramp rows and its size."""
    drv.execute_script(BAR_TEXT)
    redraw(drv, drv.find_element(By.CSS_SELECTOR, f'#grid canvas[data-head="{head}"]').click)
    limits = drv.find_element(By.ID, "focus-cbar").get_attribute("data-limits")
    (top, bottom), width, height = drv.execute_script(RAMP)
    return limits, drv.execute_script("return window.barText"), (top, bottom), (width, height)


def _text(v: float) -> str:
    return "0" if v == 0 else format(v, ".4g")  # Python's '.4g', no "-0" (as the page writes numbers)


def test_the_enlarged_heads_colour_bar_prints_its_limits_at_its_ends(driver: object, tmp_path: Path,  # noqa: F811
                                                                     make_bias_file: Callable[..., Path]) -> None:
    """Both ends of the enlarged head's bar carry the values there, in the page's one format ('.4g'): the maximum
    above the ramp's top, the minimum below its foot, apart from every other text the bar draws, for a
    sequential scale (a CABLE-like bias, <= 0) and a diverging one (A - B of two such files, both signs)."""
    a = make_bias_file(tmp_path / "a.h5", "cable", n=2, t=64, seed=1)
    b = make_bias_file(tmp_path / "b.h5", "cable", n=2, t=64, seed=2)
    with h5py.File(a) as fa, h5py.File(b) as fb:
        ba, bb = fa["layer_3/bias"][0].astype(np.float64), fb["layer_3/bias"][0].astype(np.float64)
    for args, source, head, data, diverging in (((a,), "A", 5, ba, False), ((a, b), "D", 7, ba - bb, True)):
        page = biasviz.explore(*args).save(tmp_path / f"{source}.html")
        open_page(driver, page)
        if source == "D":
            choose(driver, "source", "D")
        lo, hi = np.nanmin(data[head - 1]), np.nanmax(data[head - 1])
        assert (lo < 0 < hi) == diverging, (lo, hi)
        grid = driver.execute_script(f"const b = document.querySelector('#grid .panel[data-panel=\"{head}\"] .cbar');"
                                     " return [b.querySelector('.lo').textContent,"
                                     " b.querySelector('.hi').textContent]")  # fmt: skip
        limits, texts, (top, bottom), (width, height) = _read_focus_bar(driver, head)
        assert limits.split("|") == grid, (limits, grid)  # the same limits as the head's bar in the grid
        low, high = limits.split("|")
        assert float(low) == pytest.approx(lo, rel=1e-3) and float(high) == pytest.approx(hi, rel=1e-3, abs=1e-6)
        assert low == _text(float(low)) and high == _text(float(high)) and "-0" not in (low, high)
        assert bottom - top > 100, (top, bottom)
        boxes = {t: box for t, *box in texts}
        assert low in boxes and high in boxes, (limits, texts)
        assert boxes[high][3] <= top and boxes[high][1] >= 0, (boxes[high], top)  # above the ramp's top
        assert boxes[low][1] >= bottom and boxes[low][3] <= height, (boxes[low], bottom, height)  # below its foot
        assert all(box[0] >= 0 and box[2] <= width for box in boxes.values()), (texts, width)
        touching = [(p, q) for k, p in enumerate(texts) for q in texts[k + 1 :]
                    if min(p[3], q[3]) - max(p[1], q[1]) > 0 and min(p[4], q[4]) - max(p[2], q[2]) > 0]  # fmt: skip
        assert not touching and len(texts) >= 4, (touching, texts)
        if diverging:
            assert driver.find_element(By.ID, "focus-cbar").get_attribute("data-ends") == "B larger|A larger"
    assert console_errors(driver) == []
