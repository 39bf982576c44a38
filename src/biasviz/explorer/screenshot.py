"""README's explorer screenshots: a real page opened in headless chromium at 1400 x 900, saved as PNG.

    python -m biasviz.explorer.screenshot figures/kerple-log_explore.html figures/preview/explore_grid.png
    python -m biasviz.explorer.screenshot PAGE OUT.png --enlarge 3 --zoom 0.3,0.5,0.3,0.5

The grid with one cell hovered, or (``--enlarge H``) head H enlarged, optionally zoomed into a square given
as fractions of the matrix (first and last query, first and last key: the zoom's corners are dragged).
What is saved is the window, as a reader sees it. Needs selenium and the system's chromium and chromedriver
(``make previews`` runs it).
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from biasviz.common.atomic import replacing, temporary_name
from biasviz.common.errors import BiasvizError

WINDOW = (1400, 900)


def screenshot(page: Path, out: Path, *, head: int = 5, cell: tuple[float, float] = (0.7, 0.35),
               enlarge: int | None = None, zoom: tuple[float, ...] | None = None,
               select: dict[str, str] | None = None) -> Path:  # fmt: skip
    """Open ``page``, set the ``select`` controls (id: value), hover head ``head`` at ``cell`` (fractions of its
    height and width) or enlarge head ``enlarge`` (zoomed to ``zoom``), and save the window."""
    try:
        from selenium import webdriver
        from selenium.webdriver.common.action_chains import ActionChains
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import Select
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
        # the viewport itself 1400 x 900 (a headless window's size includes no browser frame)
        drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": WINDOW[0], "height": WINDOW[1], "deviceScaleFactor": 1, "mobile": False})
        drv.get(Path(page).resolve().as_uri())
        _wait(drv, 0)
        for select_id, value in (select or {}).items():
            control = Select(drv.find_element(By.ID, select_id))
            offered = [option.get_attribute("value") for option in control.options]
            if value not in offered:
                raise BiasvizError(f"--select {select_id}={value}: the page offers {', '.join(offered)}")
            if control.first_selected_option.get_attribute("value") == value:
                continue  # already shown: choosing it again draws nothing, so nothing is awaited
            n = _drawn(drv)
            control.select_by_value(value)
            _wait(drv, n)
        if enlarge is None:
            canvas = drv.find_element(By.CSS_SELECTOR, f'#grid canvas[data-head="{head}"]')
            w, h = _size(drv, canvas)
            ActionChains(drv).move_to_element_with_offset(canvas, round((cell[1] - 0.5) * w),
                                                          round((cell[0] - 0.5) * h)).perform()  # fmt: skip
        else:
            n = _drawn(drv)
            drv.find_element(By.CSS_SELECTOR, f'#grid canvas[data-head="{enlarge}"]').click()
            _wait(drv, n)
            canvas = drv.find_element(By.CSS_SELECTOR, "#focus-canvases canvas")
            w, h = _size(drv, canvas)
            if zoom is not None:
                i0, i1, j0, j1 = zoom
                n = _drawn(drv)
                corners = [(round((j - 0.5) * w), round((i - 0.5) * h)) for i, j in ((i0, j0), (i1, j1))]
                ActionChains(drv).move_to_element_with_offset(canvas, *corners[0]).click_and_hold()\
                    .move_to_element_with_offset(canvas, *corners[1]).release().perform()  # fmt: skip
                _wait(drv, n)
            ActionChains(drv).move_to_element_with_offset(canvas, round((cell[1] - 0.5) * w),
                                                          round((cell[0] - 0.5) * h)).perform()  # fmt: skip
        time.sleep(0.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        with replacing(out, tmp=temporary_name(out, ".png")) as tmp:  # chromium goes by the extension
            drv.save_screenshot(str(tmp))
    finally:
        drv.quit()
    return out


def _drawn(drv: object) -> int:
    return int(drv.execute_script("return Number(document.body.dataset.drawn || 0)"))


def _wait(drv: object, drawn: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while _drawn(drv) <= drawn:
        if time.monotonic() > end:
            raise BiasvizError("the page did not draw within 30 s")
        time.sleep(0.05)


def _size(drv: object, canvas: object) -> tuple[float, float]:
    return tuple(drv.execute_script("const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]",
                                    canvas))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m biasviz.explorer.screenshot", description=__doc__.split("\n")[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--head", type=int, default=5, help="the grid's head to hover")
    parser.add_argument("--cell", default="0.7,0.35", help="where to hover: fractions of the height and width")
    parser.add_argument("--enlarge", type=int, help="enlarge this head")
    parser.add_argument("--zoom", help="zoom the enlarged head: first, last query and key as fractions")
    parser.add_argument("--select", action="append", default=[], metavar="ID=VALUE", help="set a control first")
    args = parser.parse_args(argv)
    floats = lambda text: tuple(float(x) for x in text.split(","))  # noqa: E731
    select = dict(item.split("=", 1) for item in args.select)
    path = screenshot(args.page, args.out, head=args.head, cell=floats(args.cell), enlarge=args.enlarge,
                      zoom=floats(args.zoom) if args.zoom else None, select=select)  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
