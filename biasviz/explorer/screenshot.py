"""README's explorer screenshot: a real page opened in headless chromium, one cell hovered, saved as PNG.

    python -m biasviz.explorer.screenshot figures/cable_explore.html figures/preview/cable_explore.png

Needs selenium and the system's chromium and chromedriver (``make previews`` runs it).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from biasviz.common.atomic import replacing, temporary_name
from biasviz.common.errors import BiasvizError

WINDOW = (800, 900)


def screenshot(page: Path, out: Path, *, head: int = 5, cell: tuple[float, float] = (0.7, 0.35)) -> Path:
    """Open ``page``, hover head ``head`` at ``cell`` (fractions of its height and width), save the whole page."""
    try:
        from selenium import webdriver
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By
    except ImportError as exc:
        raise BiasvizError("the screenshot needs selenium: pip install -e '.[dev]'") from exc
    chromium, driver_path = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        raise BiasvizError("the screenshot needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                f"--window-size={WINDOW[0]},{WINDOW[1]}", "--force-device-scale-factor=1"):  # fmt: skip
        options.add_argument(arg)
    drv = webdriver.Chrome(service=webdriver.ChromeService(driver_path), options=options)
    try:
        drv.get(Path(page).resolve().as_uri())
        while drv.execute_script("return document.body.dataset.ready") != "1":
            time.sleep(0.05)
        canvas = drv.find_element(By.CSS_SELECTOR, f'#grid canvas[data-head="{head}"]')
        w, h = drv.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", canvas)
        ActionChains(drv).move_to_element_with_offset(canvas, round((cell[1] - 0.5) * w),
                                                      round((cell[0] - 0.5) * h)).perform()  # fmt: skip
        time.sleep(0.5)
        height = drv.execute_script("return document.documentElement.scrollHeight")
        metrics = {"width": WINDOW[0], "height": height, "deviceScaleFactor": 1, "mobile": False}
        drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)  # the whole page, not the window
        out.parent.mkdir(parents=True, exist_ok=True)
        with replacing(out, tmp=temporary_name(out, ".png")) as tmp:  # chromium goes by the extension
            drv.save_screenshot(str(tmp))
    finally:
        drv.quit()
    return out


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m biasviz.explorer.screenshot PAGE.html OUT.png")
    print(f"wrote {screenshot(Path(sys.argv[1]), Path(sys.argv[2]))}")
