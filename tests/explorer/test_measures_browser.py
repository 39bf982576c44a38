"""The focused head's docs/position-measures.md measures on the page (biasviz.explorer.measures), in a real headless
browser (chromium and chromedriver, driven by selenium, as in test_page_browser.py): drawn under a summary's distance
profile without a console error, hidden where a file holds none.

Nothing is downloaded: without chromium, chromedriver or selenium the module skips (CI installs them with
apt-get, see .ci/run).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.explorer import test_page_browser
from tests.explorer.test_page_browser import CHROMEDRIVER, CHROMIUM

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs chromium and chromedriver (Debian: apt-get install chromium chromium-driver)",
)
from selenium.webdriver.common.by import By  # noqa: E402

import biasviz  # noqa: E402
from tests.explorer.test_page_browser import choose, console_errors, open_page, pixels, redraw  # noqa: E402

driver, files = test_page_browser.driver, test_page_browser.files  # the page's fixtures, this file's own


def test_an_enlarged_head_of_a_summary_shows_its_position_measures(driver: object, tmp_path: Path,
                                                                   files: dict[str, Path]) -> None:  # fmt: skip
    """docs/position-measures.md in the page: under the distance profile of a summary's weights, each head's band and
    context mass with their 95 % bands, drawn without a console error; hidden where a file holds none (a full file)."""
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.summary import extract_summary
    from tests.conftest import small_model

    ids = np.random.default_rng(3).integers(0, 97, size=(3, 32))
    extract_summary(BiasGPTAdapter(small_model("rope"), source="test"), ids, tmp_path / "s.h5", layers=[1],
                    device="cpu", progress=False)  # fmt: skip
    biasviz.explore(tmp_path / "s.h5").save(tmp_path / "s.html")
    open_page(driver, tmp_path / "s.html")
    redraw(driver, lambda: driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="2"]').click())
    measures = driver.find_element(By.ID, "measures")
    assert measures.is_displayed()
    blank = driver.execute_script("const c = document.createElement('canvas'); c.width = arguments[0].width; "
                                  "c.height = arguments[0].height; return c.toDataURL()", measures)  # fmt: skip
    head2 = pixels(driver, "#measures")
    assert head2 != blank
    choose(driver, "focus-head", "4")
    assert pixels(driver, "#measures") not in (head2, blank)
    assert console_errors(driver) == []
    open_page(driver, files["page"])
    redraw(driver, lambda: driver.find_element(By.CSS_SELECTOR, '#grid canvas[data-head="2"]').click())
    assert not driver.find_element(By.ID, "measures").is_displayed()
