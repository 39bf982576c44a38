"""The explorer page in a real headless browser: the system's chromium and chromedriver, driven by selenium.

Nothing is downloaded: without chromium, chromedriver or selenium the module skips (CI installs them with
apt-get, see .ci/run). Expected values come from the HDF5 file through h5py, formatted by Python.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install -e '.[dev]')")
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.actions.action_builder import ActionBuilder  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webelement import WebElement  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

import biasviz  # noqa: E402

T, LAYER = 64, 3
TEXT = "the cat sat on the mat. a dog ran in the park. "


def make_driver() -> object:
    """Headless chromium at 1280 x 1400 CSS pixels, one device pixel each, keeping the console's messages."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1400",
                "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=webdriver.ChromeService(CHROMEDRIVER), options=options)


@pytest.fixture(scope="module")
def driver() -> Iterator[object]:
    if CHROMIUM is None or CHROMEDRIVER is None:  # modules that borrow this fixture skip with it
        pytest.skip("needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)")
    drv = make_driver()
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> dict[str, Path]:
    from biasviz.data.tokenizer import build_tokenizer, save_tokenizer

    root = tmp_path_factory.mktemp("explore")
    tok = build_tokenizer([TEXT * 20], vocab_size=300)
    ids = np.array([tok.encode(TEXT * 10).ids[k : k + T] for k in (0, 3, 7)], np.int32)
    attrs = {"tokenizer": str(save_tokenizer(tok, root))}
    cable = make_bias_file(root / "cable.h5", "cable", n=3, t=T, layers=(2, LAYER), input_ids=ids, attrs=attrs)
    alibi = make_bias_file(root / "alibi.h5", "alibi", n=2, t=T, layers=(2, LAYER))  # fewer samples than A
    biasviz.explore(cable).save(root / "cable.html")
    biasviz.explore(cable, alibi).save(root / "compare.html")
    return {"cable": cable, "alibi": alibi, "page": root / "cable.html", "compare": root / "compare.html",
            "tokenizer": Path(attrs["tokenizer"])}  # fmt: skip


# -- driving the page -------------------------------------------------------------------------------


def wait_for(drv: object, script: str, timeout: float = 10.0) -> object:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = drv.execute_script(script)
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for: {script}")


def open_page(drv: object, page: Path) -> None:
    drv.get(page.as_uri())
    wait_for(drv, "return document.body.dataset.ready === '1'")
    drv.get_log("browser")  # start each test with an empty log


def console_errors(drv: object) -> list[str]:
    return [e["message"] for e in drv.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def redraw(drv: object, action: Callable[[], None]) -> None:
    """Do ``action`` and wait until the page has drawn again."""
    before = int(drv.execute_script("return Number(document.body.dataset.drawn)"))
    action()
    wait_for(drv, f"return Number(document.body.dataset.drawn) > {before}")


def pixels(drv: object, css: str) -> str:
    return drv.execute_script(f"return document.querySelector('{css}').toDataURL()")


def choose(drv: object, select_id: str, value: str) -> None:
    redraw(drv, lambda: Select(drv.find_element(By.ID, select_id)).select_by_value(value))


def hover(drv: object, canvas: WebElement, i: int, j: int, region: tuple[int, int, int, int] = (0, T, 0, T)) -> str:
    """Move the mouse to the centre of cell (i, j) of ``canvas`` (showing ``region``); the read-out it gives."""
    drv.execute_script("arguments[0].scrollIntoView({block: 'center'})", canvas)
    left, top, width, height = drv.execute_script(
        "const c = arguments[0], r = c.getBoundingClientRect();"
        "return [r.left + c.clientLeft, r.top + c.clientTop, c.clientWidth, c.clientHeight]", canvas)  # fmt: skip
    i0, i1, j0, j1 = region
    x = left + (j - j0 + 0.5) / (j1 - j0) * width  # viewport pixels: no rounding of a centre in between
    y = top + (i - i0 + 0.5) / (i1 - i0) * height
    actions = ActionBuilder(drv)
    actions.pointer_action.move_to_location(round(x), round(y))
    actions.perform()
    wait_for(drv, f"const r = document.getElementById('readout').dataset; return r.query === '{i}' && r.key === '{j}'")
    time.sleep(0.05)
    return drv.find_element(By.ID, "readout").text


def stored(path: Path, kind: str, sample: int, head: int, i: int, j: int, layer: int = LAYER) -> np.float32:
    with h5py.File(path) as f:
        return f[f"layer_{layer}/{kind}"][sample, head - 1, i, j]


# -- tests ---------------------------------------------------------------------------------------------


def test_hovering_a_cell_reads_its_stored_value_and_tokens(driver: object, files: dict[str, Path]) -> None:
    from biasviz.data import load_tokenizer

    open_page(driver, files["page"])
    canvas = driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="3"]')
    text = hover(driver, canvas, 40, 17)
    value = stored(files["cable"], "bias", 0, 3, 40, 17)
    assert f"value {float(value):.4g} (exact)" in text, text
    assert "head 3 · query i = 40 · key j = 17 · d = i - j = 23" in text
    tok = load_tokenizer(files["tokenizer"])
    with h5py.File(files["cable"]) as f:
        ids = f["input_ids"][0]
    assert f"query {json.dumps(tok.decode([int(ids[40])]))} (id {ids[40]})" in text
    assert f"key {json.dumps(tok.decode([int(ids[17])]))} (id {ids[17]})" in text
    assert "masked" in hover(driver, canvas, 5, 30)
    assert console_errors(driver) == []


def test_numbers_are_formatted_as_python_formats_them(driver: object, files: dict[str, Path]) -> None:
    """Four significant digits exactly as ``format(v, '.4g')``: ties to even, exponents, signs, rounding up."""
    open_page(driver, files["page"])
    rng = np.random.default_rng(3)
    values = [0.0, 1.0625, 1.0635, 2.5, 0.00012345, 1e-5, -2.5e10, 9.9995, 99995.0, 123456.0, 0.1, -0.03125,
              float(np.float32(0.1)), 65504.0, 1234.5, 1235.5]  # fmt: skip
    values += [float(np.float32(x)) for x in rng.normal(size=40) * 10.0 ** rng.integers(-9, 9, size=40)]
    got = driver.execute_script("return arguments[0].map((v) => window.biasviz.format(v))", values)
    assert got == [format(v, ".4g") for v in values]


def test_a_negative_zero_reads_0_in_the_read_out_and_on_the_colour_bars(driver: object, files: dict[str, Path],
                                                                        tmp_path: Path) -> None:  # fmt: skip
    """ALiBi's diagonal is stored as -0.0 (-m * 0): the page never prints "-0" (FIGURES.md, ticks), not in the
    read-out, not at a colour bar's end, not on the enlarged head's bar or its profile."""
    with h5py.File(files["alibi"]) as f:
        bias = f[f"layer_{LAYER}/bias"][0, 0]
    assert bias[9, 9] == 0 and np.signbit(bias[9, 9]) and np.nanmax(bias) == 0  # the file holds -0.0 there
    page = biasviz.explore(files["alibi"]).save(tmp_path / "alibi.html")
    record = driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
      window.drawnText = [];  // every text the page's canvases draw
      const fill = CanvasRenderingContext2D.prototype.fillText;
      CanvasRenderingContext2D.prototype.fillText = function (text, ...rest) {
        window.drawnText.push(String(text)); return fill.call(this, text, ...rest); };"""})  # fmt: skip
    try:
        open_page(driver, page)
    finally:
        driver.execute_cdp_cmd("Page.removeScriptToEvaluateOnNewDocument", {"identifier": record["identifier"]})
    assert driver.execute_script("return window.biasviz.format(-0)") == "0"
    canvas = driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="1"]')
    text = hover(driver, canvas, 9, 9)
    assert "d = i - j = 0 · value 0 (exact)" in text, text
    bars = driver.execute_script("return Array.from(document.querySelectorAll('#grid .cbar'), (b) =>"
                                 " [b.querySelector('.lo').textContent, b.querySelector('.hi').textContent,"
                                 " b.dataset.ticks])")  # fmt: skip
    assert len(bars) == 12 and all(hi == "0" for _, hi, _ in bars), bars
    redraw(driver, lambda: canvas.click())  # the enlarged head: its colour bar and distance profile
    assert driver.find_element(By.ID, "focus").is_displayed()
    hover(driver, driver.find_element(By.CSS_SELECTOR, "#focus-canvases canvas"), 9, 9)
    shown = driver.execute_script("return [document.body.innerText, ...window.drawnText]")
    words = " ".join(shown).replace("\u2212", "-").replace("(", " ").split()
    assert len(shown) > 20 and not [w for w in words if w.startswith("-0") and float(w.rstrip(".,)")) == 0], words
    assert console_errors(driver) == []


def test_switching_kind_sample_and_scale_redraws_and_reads_the_new_values(driver: object,
                                                                          files: dict[str, Path]) -> None:  # fmt: skip
    open_page(driver, files["page"])
    first = '#grid canvas[data-head="1"]'
    seen = [pixels(driver, first)]
    choose(driver, "kind", "weights")
    seen.append(pixels(driver, first))
    choose(driver, "sample", "2")
    seen.append(pixels(driver, first))
    choose(driver, "sample", "mean")
    seen.append(pixels(driver, first))
    redraw(driver, lambda: driver.find_element(By.ID, "shared").click())
    seen.append(pixels(driver, first))
    redraw(driver, lambda: driver.find_element(By.ID, "log").click())
    seen.append(pixels(driver, first))
    assert len(set(seen)) == len(seen), "every switch must change what head 1 shows"
    choose(driver, "sample", "2")
    canvas = driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="7"]')
    text = hover(driver, canvas, 50, 48)
    assert f"value {float(stored(files['cable'], 'weights', 2, 7, 50, 48)):.4g} (exact)" in text, text
    before = pixels(driver, first)
    choose(driver, "layer", "2")
    assert pixels(driver, first) != before
    text = hover(driver, canvas, 50, 48)
    assert f"value {float(stored(files['cable'], 'weights', 2, 7, 50, 48, layer=2)):.4g} (exact)" in text, text
    assert console_errors(driver) == []


def test_enlarge_switch_head_zoom_and_profile(driver: object, files: dict[str, Path]) -> None:
    open_page(driver, files["page"])
    redraw(driver, lambda: driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="2"]').click())
    assert driver.find_element(By.ID, "focus").is_displayed()
    assert not driver.find_element(By.ID, "grid").is_displayed()
    focus = "#focus-canvases canvas"
    head2, profile2 = pixels(driver, focus), pixels(driver, "#profile")
    choose(driver, "focus-head", "5")
    assert pixels(driver, focus) != head2 and pixels(driver, "#profile") != profile2
    canvas = driver.find_element(By.CSS_SELECTOR, focus)
    size = driver.execute_script("return arguments[0].clientWidth", canvas)
    cell = size / T
    start, end = ((10 + 0.5) * cell - size / 2, (30 + 0.5) * cell - size / 2)

    def drag() -> None:
        ActionChains(driver).move_to_element_with_offset(canvas, round(start), round(start)).click_and_hold()\
            .move_to_element_with_offset(canvas, round(end), round(end)).release().perform()  # fmt: skip

    redraw(driver, drag)
    assert "queries 10-30, keys 10-30" in driver.find_element(By.ID, "focus-title").text
    text = hover(driver, canvas, 25, 12, region=(10, 31, 10, 31))
    assert f"value {float(stored(files['cable'], 'bias', 0, 5, 25, 12)):.4g} (exact)" in text, text
    redraw(driver, lambda: driver.find_element(By.ID, "focus-close").click())
    assert driver.find_element(By.ID, "grid").is_displayed()
    assert console_errors(driver) == []


def test_two_files_side_by_side_and_their_difference(driver: object, files: dict[str, Path],
                                                     tmp_path: Path) -> None:  # fmt: skip
    open_page(driver, files["compare"])
    choose(driver, "source", "D")
    choose(driver, "sample", "1")
    canvas = driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="4"]')
    text = hover(driver, canvas, 33, 9)
    diff = stored(files["cable"], "bias", 1, 4, 33, 9) - stored(files["alibi"], "bias", 1, 4, 33, 9)
    assert "A - B · head 4" in text and f"value {float(diff):.4g} (exact)" in text, text
    choose(driver, "source", "A")
    choose(driver, "sample", "2")  # A has a third sample, B has not: side by side falls back to those of both
    choose(driver, "source", "AB")
    options = Select(driver.find_element(By.ID, "sample")).options
    assert [o.get_attribute("value") for o in options] == ["0", "1", "mean"]
    choose(driver, "sample", "1")
    shown = driver.find_elements(By.CSS_SELECTOR, '#grid .panel[data-panel="1"] canvas[data-head]')
    assert [c.get_attribute("data-source") for c in shown if c.is_displayed()] == ["A", "B"]
    b_canvas = next(c for c in shown if c.get_attribute("data-source") == "B")
    text = hover(driver, b_canvas, 20, 4)
    assert f"value {float(stored(files['alibi'], 'bias', 1, 1, 20, 4)):.4g} (exact)" in text, text
    shot = tmp_path / "explore.png"
    driver.save_screenshot(str(shot))
    assert shot.stat().st_size > 20_000
    assert console_errors(driver) == []


def test_a_traced_file_s_calls_are_named_with_their_modules_as_text(driver: object, tmp_path: Path,
                                                                    make_bias_file: Callable[..., Path]) -> None:
    """A traced model's layers are its attention calls: the layer menu and the line above the heads name each call and
    the module that made it, as the file records it; a name is text, never markup."""
    owners = ["model.layers.0.self_attn", "model.layers.0.self_attn", "model.layers.1.<i>attn</i>"]
    path = make_bias_file(tmp_path / "traced.h5", "alibi", n=2, t=16, layers=(1, 2),
                          attrs={"n_layers": 3, "call_modules": json.dumps(owners)})  # fmt: skip
    page = biasviz.explore(path).save(tmp_path / "traced.html")
    open_page(driver, page)
    options = Select(driver.find_element(By.ID, "layer")).options
    assert [o.text for o in options] == ["attention call 1 (model.layers.0.self_attn)",
                                         "attention call 2 (model.layers.1.<i>attn</i>)"]  # fmt: skip
    assert "· attention call 2 (model.layers.1.<i>attn</i>) ·" in driver.find_element(By.ID, "where").text
    assert driver.find_elements(By.CSS_SELECTOR, "#where i, select i") == []
    choose(driver, "layer", "1")
    assert "· attention call 1 (model.layers.0.self_attn) ·" in driver.find_element(By.ID, "where").text
    assert console_errors(driver) == []
