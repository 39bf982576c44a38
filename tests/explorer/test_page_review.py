"""The explorer as a reviewer reads it at 1400 x 900 (chromium through selenium): every grid colour bar marks round
values besides its limits, and an enlarged head is drawn cell by cell, not as block means that look like steps.

Expected values come from the HDF5 files through h5py and from Python's own number formatting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("selenium.webdriver", reason="needs selenium (pip install -e '.[dev]')")
from tests.explorer.test_page_browser import choose, console_errors, driver, open_page, redraw  # noqa: F401  (fixture)

By = pytest.importorskip("selenium.webdriver.common.by").By

import biasviz  # noqa: E402

T = 128  # above 64: a tight budget's overviews are 2 x 2 block means


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory, make_bias_file: Callable[..., Path]) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("review")
    a = make_bias_file(root / "a.h5", "cable", n=2, t=T, seed=1)
    b = make_bias_file(root / "b.h5", "cable", n=2, t=T, seed=2)
    out = {"a": a}
    # 1 MB: room for every head at full resolution in 16 bits, not for every head exact
    for name, args, mb in (("page", (a,), 1.0), ("tight", (a,), 0.5), ("pair", (a, b), 2.0)):
        out[name] = biasviz.explore(*args, max_mb=mb).save(root / f"{name}.html")
    return out


@pytest.fixture()
def window(driver: object) -> Iterator[None]:  # noqa: F811
    """A 1400 x 900 viewport, as README's screenshots are taken; reset after."""
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
    yield
    driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})


BARS = """return Array.from(document.querySelectorAll('#grid .panel'), (p) => {
  const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
  const ramp = p.querySelector('.cbar canvas.ramp');
  const d = ramp.getContext('2d').getImageData(0, 0, ramp.width, ramp.height).data;
  const ticks = Array.from(p.querySelectorAll('.cbar .ticks span'), (s) => [s.textContent, box(s)]);
  const marks = ticks.map(([, b]) => [-1, 0, 1].some((dx) => {  // a dark mark under the label's centre
    const x = Math.min(ramp.width - 1, Math.max(0, Math.floor((b[0] + b[2]) / 2 - box(ramp)[0]) + dx));
    const o = ((ramp.height - 2) * ramp.width + x) * 4; return d[o] === 68 && d[o + 1] === 68 && d[o + 3] === 255; }));
  return {lo: p.querySelector('.cbar .lo').textContent, hi: p.querySelector('.cbar .hi').textContent,
          limits: [box(p.querySelector('.cbar .lo')), box(p.querySelector('.cbar .hi'))], ramp: box(ramp),
          ticks, marks, panel: box(p)};
});"""


def _touch(a: list[float], b: list[float]) -> bool:
    return min(a[2], b[2]) - max(a[0], b[0]) > 0.5 and min(a[3], b[3]) - max(a[1], b[1]) > 0.5


def _check_bars(bars: list[dict], centred: bool) -> None:
    """Round values (one step apart, Python's '.4g' text) inside the limits, at their places, none touching."""
    assert len(bars) == 12
    labels = []
    for bar in bars:
        lo, hi = float(bar["lo"]), float(bar["hi"].removeprefix("\u2265\u2009"))  # "≥ ": colours end below the data
        texts = [t for t, _ in bar["ticks"]]
        assert 2 <= len(texts) <= 5, (bar["lo"], bar["hi"], texts)
        values = [float(t) for t in texts]
        assert texts == [format(v, ".4g") for v in values] and "-0" not in texts, texts  # the page's one format
        steps = np.diff(values)
        step = float(steps.min())
        mantissa = step / 10 ** math.floor(math.log10(step) + 1e-9)
        assert np.allclose(steps, step, rtol=1e-6) and min(abs(mantissa - m) for m in (1, 2, 5)) < 1e-6, values
        assert all(lo - 1e-3 * abs(lo) <= v <= hi + 1e-3 * abs(hi) for v in values), (lo, hi, values)
        if lo < 0 < hi:
            assert 0.0 in values, (lo, hi, values)
        left, _, right, _ = bar["ramp"]
        for v, (_, box) in zip(values, bar["ticks"], strict=True):  # each label centred on its value's place
            frac = ((0.5 * (v - lo) / -lo if v < 0 else 0.5 + 0.5 * v / hi) if centred
                    else (v - lo) / (hi - lo))  # fmt: skip
            assert abs((box[0] + box[2]) / 2 - (left + frac * (right - left))) < 2.5, (v, box, bar["ramp"])
        assert all(bar["marks"]), (bar["marks"], bar["ticks"], bar["ramp"], lo, hi)  # a tick mark under each label
        labels += [box for _, box in bar["ticks"]] + bar["limits"]
        assert all(bar["panel"][0] - 8 <= b[0] and b[2] <= bar["panel"][2] + 8 for b in labels[-len(texts) - 2 :])
    touching = [(a, b) for k, a in enumerate(labels) for b in labels[k + 1 :] if _touch(a, b)]
    assert not touching, touching


@pytest.mark.usefixtures("window")
def test_every_grid_colour_bar_marks_round_values_that_never_touch(driver: object,  # noqa: F811
                                                                   pages: dict[str, Path]) -> None:
    open_page(driver, pages["pair"])
    for kind in ("weights", "bias"):  # sequential scales: from a weight near 0, and from a bias below 0
        choose(driver, "kind", kind)
        bars = driver.execute_script(BARS)
        _check_bars(bars, centred=False)
        # a weights scale ends at its 99.5th percentile, below the largest weight, and says so; a bias's at its largest
        assert any(b["hi"].startswith("\u2265") for b in bars) == (kind == "weights"), [b["hi"] for b in bars]
    choose(driver, "source", "D")  # A - B changes sign: diverging around 0, lopsided, 0 always marked
    bars = driver.execute_script(BARS)
    assert any(float(b["lo"]) < 0 < float(b["hi"]) for b in bars)
    _check_bars(bars, centred=True)
    choose(driver, "source", "AB")  # one bar under each pair, as wide as the pair
    _check_bars(driver.execute_script(BARS), centred=False)
    assert console_errors(driver) == []


CELLS = """const cv = document.querySelector('#focus-canvases canvas.matrix'); const s = cv.width / arguments[0];
return [cv.dataset.cell, document.querySelector('.fplot-label').textContent,
        arguments[1].map(([i, j]) => Array.from(cv.getContext('2d').getImageData(Math.floor((j + 0.5) * s),
                                                Math.floor((i + 0.5) * s), 1, 1).data))];"""


def _split_blocks(path: Path, head: int, count: int = 6) -> list[tuple[int, int]]:
    """Cells (i, j), (i + 1, j) of 2 x 2 blocks whose mean weights differ most: one colour as a block mean."""
    with h5py.File(path) as f:
        m = f["layer_3/weights"][:, head - 1].mean(axis=0, dtype=np.float64)
    lo, hi = m[np.tril_indices(T)].min(), m[np.tril_indices(T)].max()
    diff = np.abs(m[1::2, ::2] - m[::2, ::2])  # (i, j) with i even, against (i + 1, j)
    diff[np.triu_indices(diff.shape[0], 1)] = 0  # causal cells only (j <= i in both rows)
    order = np.argsort(diff, axis=None)[::-1][:count]
    assert diff.ravel()[order].min() > 0.05 * (hi - lo)  # colours apart on the head's scale
    return [(2 * int(k // diff.shape[1]), 2 * int(k % diff.shape[1])) for k in order]


@pytest.mark.usefixtures("window")
def test_an_enlarged_head_of_mean_weights_is_drawn_cell_by_cell(driver: object,  # noqa: F811
                                                                pages: dict[str, Path]) -> None:
    head = 3
    blocks = _split_blocks(pages["a"], head)
    cells = [c for i, j in blocks for c in ((i, j), (i + 1, j))]
    for name, cell, note in (("page", "1", False), ("tight", "2", True)):
        open_page(driver, pages[name])
        choose(driver, "kind", "weights")
        choose(driver, "sample", "mean")
        redraw(driver, driver.find_element(By.CSS_SELECTOR, f'#grid canvas[data-head="{head}"]').click)
        drawn, label, colours = driver.execute_script(CELLS, T, cells)
        pairs = list(zip(colours[::2], colours[1::2], strict=True))
        if note:  # a page too small for this view: its block means are said to be block means
            assert all(a == b for a, b in pairs) and "drawn as 2 × 2 block means" in label, label
        else:  # one drawn cell is one matrix cell: the rows of a 2 x 2 block keep their own colours
            assert all(a != b for a, b in pairs) and "block means" not in label, pairs
        assert drawn == cell, (name, drawn)  # positions one drawn cell spans, for scripts
    assert console_errors(driver) == []
