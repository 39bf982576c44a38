"""Benchmark of `biasviz plot`: rendering cost, PDF size and long-sequence time.

Prints three numbers the figures are held to:
1. the 12 x 512 x 512 grid (PDF + PNG) against a plain matplotlib loop drawing the same panels
   (imshow with its defaults, ticks every 100, a colorbar and a title per panel, constrained layout,
   same size, formats and resolutions): ratio <= 1.5;
2. the size of that PDF: < 2 MB;
3. `biasviz plot` on a 12 x 4096 x 4096 float32 file (800 MB of bias): < 10 s.

Run: ``python bench/bench_plot.py [--workdir DIR] [--repeat N]``. The 4096 file is written once into
the work folder and reused.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

H = 12


def cable_like(t: int, seed: int = 0) -> np.ndarray:
    """Context-dependent bias s_i - s_j with s the negative cumulative softplus of random inputs."""
    rng = np.random.default_rng(seed)
    s = -np.cumsum(np.log1p(np.exp(rng.normal(size=(H, t)) + np.linspace(-3, 1, H)[:, None])), axis=-1)
    b = (s[:, :, None] - s[:, None, :]).astype(np.float32)
    b[:, np.triu(np.ones((t, t), dtype=bool), k=1)] = np.nan
    return b


def plain_loop(data: np.ndarray) -> None:
    """The same panels drawn the obvious way: imshow defaults, ticks every 100, a colorbar and title each."""
    fig = Figure(figsize=(5.5, 4 * 5.5 / 3 * 0.8 + 0.25), layout="constrained")
    ticks = np.arange(0, data.shape[-1], 100)
    for h, ax in enumerate(fig.subplots(4, 3).ravel()):
        im = ax.imshow(data[h])
        fig.colorbar(im, ax=ax)
        ax.set_title(f"Head {h + 1}")
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
    fig.savefig(io.BytesIO(), format="pdf", dpi=300)
    fig.savefig(io.BytesIO(), format="png", dpi=200)


def biasviz_grid(data: np.ndarray, out: Path) -> Path:
    from biasviz.plotting.heatmap import head_grid
    from biasviz.plotting.save import save_figure

    return save_figure(head_grid(data), out / "grid", ["pdf", "png"], dpi=200)[0]


def interleaved(fns: list, repeat: int) -> list[float]:
    """Median time of each function, run in turns so that load from other processes hits all alike."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return [statistics.median(t) for t in times]


def long_file(path: Path, t: int = 4096) -> Path:
    if path.exists():
        return path
    from biasviz.store import BiasFileWriter

    attrs = {"scheme": "cable", "context_dependent": True, "source_model": "synthetic", "model_sha256": "0" * 64,
             "architecture": "gpt2", "n_layers": 12, "seed": 0, "text_source": "synthetic", "device": "cpu",
             "biasviz_version": "bench", "torch_version": "none"}  # fmt: skip
    bias = cable_like(t)[None]
    weights = np.tril(np.ones((1, H, t, t), dtype=np.float32)) / np.arange(1, t + 1, dtype=np.float32)[:, None]
    with BiasFileWriter(path, attrs=attrs, n_samples=1, n_heads=H, seq_len=t, layers=[11], has_bias=True,
                        force=True) as w:  # fmt: skip
        w.write_batch(np.zeros((1, t), np.int32), weights={11: weights}, bias={11: bias})
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/biasviz-bench"))
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)

    data = cable_like(512)
    plain_loop(data), biasviz_grid(data, args.workdir)  # warm-up: imports, fonts, colormaps
    t_plain, t_grid = interleaved([lambda: plain_loop(data), lambda: biasviz_grid(data, args.workdir)], args.repeat)
    pdf_mb = (args.workdir / "grid.pdf").stat().st_size / 1e6
    print(
        f"12 x 512 x 512, PDF + PNG: plain imshow loop {t_plain:.2f} s, biasviz head_grid {t_grid:.2f} s, "
        f"ratio {t_grid / t_plain:.2f} (limit 1.5)"
    )
    png_mb = (args.workdir / "grid.png").stat().st_size / 1e6
    print(f"PDF size at T=512: {pdf_mb:.2f} MB (limit 2 MB); PNG at 200 dpi {png_mb:.2f} MB")

    path = long_file(args.workdir / "cable4096.h5")
    from biasviz.cli import main as cli_main

    t0 = time.perf_counter()
    try:
        cli_main(["plot", "--scheme", "cable", "--input", str(path), "--out-dir", str(args.workdir / "figs")])
    except SystemExit as exc:
        if exc.code:
            raise
    t_long = time.perf_counter() - t0
    size = (args.workdir / "figs" / "cable_bias.pdf").stat().st_size / 1e6
    print(
        f"12 x 4096 x 4096 file ({path.stat().st_size / 1e6:.0f} MB on disk), `biasviz plot` PDF + PNG: "
        f"{t_long:.2f} s (limit 10 s); PDF {size:.2f} MB"
    )


if __name__ == "__main__":
    main()
