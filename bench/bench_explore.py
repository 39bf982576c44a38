"""Explorer pages of 12 heads x T^2: HTML size, build time, and time to open and to read a cell in headless chromium.

    .venv/bin/python bench/bench_explore.py --seq-len 1024 4096

Two files per length, one sample, one layer, bias and weights: ALiBi (a Toeplitz bias) and a CABLE-like
cumulative decay that changes with every cell. The weights are the softmax of the bias plus N(0, 1) scores,
as noisy as real attention. Needs chromium and chromedriver (apt-get install chromium chromium-driver).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import biasviz
from biasviz.store import BiasFileWriter

HEADS, LAYER = 12, 11
ATTRS = {"source_model": "synthetic", "model_sha256": "0" * 64, "architecture": "gpt2", "n_layers": 12, "seed": 0,
         "text_source": "synthetic", "device": "cpu", "biasviz_version": biasviz.__version__,
         "torch_version": "none"}  # fmt: skip


def head_bias(scheme: str, head: int, t: int, rng: np.random.Generator) -> np.ndarray:
    pos = np.arange(t, dtype=np.float32)
    if scheme == "alibi":
        b = -(2.0 ** (-8 * head / HEADS)) * (pos[:, None] - pos[None, :])
    else:
        s = -np.cumsum(np.log1p(np.exp(rng.normal(-2, 1, size=t))))
        b = s[:, None] - s[None, :]
    return np.where(np.tri(t, dtype=bool), b, np.nan).astype(np.float32)


def head_weights(bias: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    z = np.where(np.isnan(bias), -np.inf, bias + rng.standard_normal(bias.shape, dtype=np.float32))
    z -= z.max(-1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(-1, keepdims=True)
    return z


def write(path: Path, scheme: str, t: int) -> None:
    rng = np.random.default_rng(0)
    bias = np.stack([head_bias(scheme, h, t, rng) for h in range(1, HEADS + 1)])[None]
    weights = np.stack([head_weights(bias[0, h], rng) for h in range(HEADS)])[None]
    attrs = {**ATTRS, "scheme": scheme, "context_dependent": scheme == "cable"}
    with BiasFileWriter(path, attrs=attrs, n_samples=1, n_heads=HEADS, seq_len=t, layers=[LAYER], has_bias=True,
                        force=True) as writer:  # fmt: skip
        writer.write_batch(np.zeros((1, t), np.int32), weights={LAYER: weights}, bias={LAYER: bias})


def browser():  # noqa: ANN201
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1400"):
        options.add_argument(arg)
    return webdriver.Chrome(service=webdriver.ChromeService(shutil.which("chromedriver")), options=options)


def open_times(drv, page: Path, runs: int) -> tuple[list[list[float]], list[float]]:  # noqa: ANN001
    """Milliseconds from navigation to the drawn grid (and to the script's start, i.e. the file loaded and
    parsed), and for the first read-out of head 1 (decoding its finest level)."""
    opened, first_read = [], []
    for _ in range(runs):
        drv.get("about:blank")
        drv.get(page.as_uri())
        while not drv.execute_script("return document.body.dataset.ready === '1'"):
            time.sleep(0.01)
        opened.append(drv.execute_script("return [window.biasvizReadyMs, window.biasvizStartMs]"))
        first_read.append(_first_read(drv))
    return opened, first_read


def _first_read(drv) -> float:  # noqa: ANN001
    return drv.execute_async_script(
        "const done = arguments[arguments.length - 1]; const t0 = performance.now();"
        "const cv = document.querySelector('#grid canvas[data-head=\"1\"]'); const r = cv.getBoundingClientRect();"
        "cv.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: r.left + r.width / 4,"
        " clientY: r.top + r.height * 3 / 4}));"
        "const wait = () => document.getElementById('readout').dataset.head ? done(performance.now() - t0)"
        " : setTimeout(wait, 1); wait();"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seq-len", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-mb", type=float, default=None, help="size budget (default: the explorer's own)")
    args = ap.parse_args()
    drv = browser()
    drv.set_script_timeout(120)
    print("| T | file | page MB | build s | open ms, median [min-max] | of which loading and parsing ms | "
          "first read-out ms | detail per head |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for t in args.seq_len:
                for scheme in ("alibi", "cable"):
                    src = Path(tmp) / f"{scheme}_{t}.h5"
                    write(src, scheme, t)
                    start = time.perf_counter()
                    page = biasviz.explore(src, max_mb=args.max_mb)
                    built = time.perf_counter() - start
                    html = page.save(Path(tmp) / f"{scheme}_{t}.html", force=True)
                    opened, read = open_times(drv, html, args.runs)
                    ready, parsed = [o[0] for o in opened], [o[1] for o in opened]
                    print(f"| {t} | {scheme} (bias + weights) | {page.nbytes / 1e6:.1f} | {built:.1f} | "
                          f"{statistics.median(ready):.0f} [{min(ready):.0f}-{max(ready):.0f}] | "
                          f"{statistics.median(parsed):.0f} | "
                          f"{statistics.median(read):.0f} | {page.summary.removeprefix('heads by detail: ')} |",
                          flush=True)  # fmt: skip
                    src.unlink()
    finally:
        drv.quit()


if __name__ == "__main__":
    main()
