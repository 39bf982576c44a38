"""One figure of several models far past their training length, from summary files (``extract --summary``).

Per file one row: the mean bias map of the first and the last head (positions on the axes, blocks where the
file stores blocks) and the distance profiles b(d) of every head on a log distance axis (d >= 1), with the
training length marked. Used by
``make figures`` for ALiBi and KERPLE-log at T = 16384::

    python -m biasviz.plotting.long_context data/alibi-16k.h5 data/kerple-log-16k.h5 --train-len 128 \\
        --out figures/long_context
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure

from biasviz.plotting.heatmap import head_heatmap, tick_step_for
from biasviz.plotting.save import parse_formats, save_figure
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, literal, paper_context, wrap_title
from biasviz.store import open_bias_file
from biasviz.store.reader import BiasFile

HEAD_CMAP = "viridis"
DISPLAY_NAMES = {"alibi": "ALiBi", "kerple-log": "KERPLE-log", "kerple-power": "KERPLE-power", "fire": "FIRE",
                 "t5": "T5", "cable": "CABLE", "fox": "FoX"}  # fmt: skip


def long_context_figure(files: Sequence[BiasFile], *, train_len: int | None = None, layer: int = -1,
                        style: str = DEFAULT_STYLE) -> Figure:  # fmt: skip
    """Rows of [head 1 map, head H map, every head's b(d)] for each summary file."""
    with paper_context(style) as width:
        fig = Figure(figsize=(width, 1.75 * len(files) + 0.35), layout="constrained")
        rows = fig.subfigures(len(files), 1, squeeze=False)[:, 0]
        for sub, bf in zip(rows, files, strict=True):
            _row(sub, bf, layer, train_len)
        f0 = files[0]
        what = f"mean over {f0.n_samples} samples" if f0.n_samples else "from the formula"
        times = f" ({f0.seq_len / train_len:g}× the training length)" if train_len else ""
        title = f"Layer {f0.resolve_layer(layer)} at T = {f0.seq_len}{times}, {what}"
        size = font_sizes(width)["base"]
        fig.suptitle(wrap_title(title, width, size), fontsize=size)
    return fig


def _row(sub: Figure, bf: BiasFile, layer: int, train_len: int | None) -> None:
    maps = bf.summary_map("bias_mean", bf.resolve_layer(layer))  # (H, nb, nb)
    mean, _ = bf.profile("bias", bf.resolve_layer(layer))  # (H, T)
    heads = maps.shape[0]
    name = DISPLAY_NAMES.get(bf.scheme, literal(bf.scheme))
    axes = sub.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.25]})
    for ax, h in zip(axes[:2], (0, heads - 1), strict=True):
        head_heatmap(maps[h], ax=ax, kind="bias", seq_len=bf.seq_len, title=f"{name}, head {h + 1}",
                     tick_step=tick_step_for(bf.seq_len) * 2)  # fmt: skip
        ax.set_xlabel("key $j$")
        ax.set_ylabel("query $i$")
    ax = axes[2]
    d = np.arange(mean.shape[-1])
    cmap = _head_colours(heads)
    for h in range(heads):  # a log distance axis: the training length and 100x past it both get room
        ax.plot(d[1:], mean[h, 1:], color=cmap.to_rgba(h + 1), linewidth=0.8)
    if train_len:
        ax.axvline(train_len, color="0.3", linewidth=0.6, linestyle="--")
        ax.annotate("training length", (train_len, 0.05), xycoords=("data", "axes fraction"), xytext=(-2, 0),
                    textcoords="offset points", ha="right", va="bottom", rotation=90,
                    fontsize=font_sizes(6.0)["tick"], color="0.3")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlim(1, d[-1])
    ax.set_xlabel("distance $d = i - j$ (log)")
    ax.set_ylabel("mean bias $b(d)$")
    ax.set_title(f"{name}, every head")
    ax.grid(True, linewidth=0.3, alpha=0.5)
    bar = sub.colorbar(cmap, ax=ax, ticks=[1, heads // 2, heads], fraction=0.06, pad=0.02)
    bar.set_label("head")
    bar.ax.tick_params(width=0.5, length=2.0)


def _head_colours(heads: int) -> ScalarMappable:
    """A discrete colour per head (1 .. H) from a sequential map, stopping short of its pale end (visible on white)."""
    import matplotlib as mpl
    from matplotlib.colors import ListedColormap

    cmap = ListedColormap(mpl.colormaps[HEAD_CMAP](np.linspace(0.0, 0.85, heads)))
    return ScalarMappable(norm=BoundaryNorm(np.arange(0.5, heads + 1.5), heads), cmap=cmap)


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="summary files (extract --summary)")
    p.add_argument("--out", type=Path, required=True, help="output path without extension")
    p.add_argument("--train-len", type=int, default=None, help="the models' training length, marked on b(d)")
    p.add_argument("--format", default="pdf,png")
    p.add_argument("--style", default=DEFAULT_STYLE)
    args = p.parse_args(argv)
    files = [open_bias_file(f) for f in args.files]
    try:
        fig = long_context_figure(files, train_len=args.train_len, style=args.style)
        for path in save_figure(fig, args.out, parse_formats(args.format)):
            print(f"wrote {path}")
    finally:
        for f in files:
            f.close()


if __name__ == "__main__":
    main()
