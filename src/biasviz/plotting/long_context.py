"""One figure of several models far past their training length, from summary files (``extract --summary``).

Per file one row, named by its scheme: the mean bias map of the first and the last head (positions on the
axes, blocks where the file stores blocks) and the distance profiles b(d) of every head on a log distance axis
(d >= 1), with the training length marked. Panel titles are short ("Head 1"): a title wider than its panel
runs into the query axis's first tick label. Used by ``make figures`` for ALiBi and KERPLE-log at T = 16384::

    python -m biasviz.plotting.long_context data/alibi-16k.h5 data/kerple-log-16k.h5 --train-len 128 \\
        --out figures/long_context [--width column|page|INCHES]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure, SubFigure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from biasviz.plotting.heatmap import _label_colorbar, colorbar_label, head_heatmap, tick_step_for
from biasviz.plotting.save import parse_formats, save_figure
from biasviz.plotting.scales import format_colorbars
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, literal, paper_context, with_width, wrap_title
from biasviz.plotting.titles import figure_title, made_by, samples_text, scheme_name, trained_text
from biasviz.store import open_bias_file
from biasviz.store.datasets import map_name
from biasviz.store.reader import BiasFile

HEAD_CMAP = "viridis"
#: Below this width (inches: a paper's column) each file's profiles go below its two maps, not beside them.
NARROW = 4.0
#: Plain integers on the log distance axis (1, 10, 100, ...): the figure's one tick format, as on the maps' axes.
PLAIN = FuncFormatter(lambda x, _pos: f"{x:.0f}")


def long_context_figure(files: Sequence[BiasFile], *, train_len: int | None = None, layer: int = -1,
                        style: str = DEFAULT_STYLE) -> Figure:  # fmt: skip
    """Rows of [head 1 map, head H map, every head's b(d)] for each summary file, each row titled by its scheme."""
    with paper_context(style) as width:
        per_row = 3.3 if width < NARROW else 1.9  # two rows of panels per file at a column's width
        fig = Figure(figsize=(width, per_row * len(files) + 0.6), layout="constrained")
        rows = fig.subfigures(len(files), 1, squeeze=False)[:, 0]
        notes = [trained_text(bf) for bf in files]
        shared = notes[0] if len(set(notes)) == 1 else None  # said once in the title when every row shares it
        for sub, bf, note in zip(rows, files, notes, strict=True):
            _row(sub, bf, layer, train_len, None if shared or not note else note)
        maps = [im.colorbar for sub in rows for ax in sub.axes for im in ax.images if im.colorbar is not None]
        format_colorbars(maps)  # one number format over every map's colour bar
        fig.suptitle(wrap_title(_title(files[0], layer, train_len, shared), width, font_sizes(width)["base"]),
                     fontsize=font_sizes(width)["base"])  # fmt: skip
    return fig


def _title(f0: BiasFile, layer: int, train_len: int | None, note: str | None) -> str:
    """What the figure shows (:func:`figure_title`): layer, length, how the maps were averaged, and how the models
    were trained."""
    times = f" ({f0.seq_len / train_len:g}× the training length)" if train_len else ""
    block = f0.block or 1
    maps = f"maps: block means of {block} × {block} positions" if block > 1 else None
    return figure_title("Bias far past the training length", layer=f0.resolve_layer(layer), n_layers=f0.n_layers,
                        seq_len=f"{f0.seq_len}{times}", which=samples_text(f0.n_samples, bias_only=f0.bias_only),
                        details=[maps], trained=note, made_by=made_by(f0, f0.resolve_layer(layer)))  # fmt: skip


def _row(sub: SubFigure, bf: BiasFile, layer: int, train_len: int | None, note: str | None) -> None:
    maps = bf.summary_map(map_name("bias"), bf.resolve_layer(layer))  # (H, nb, nb)
    mean, _ = bf.profile("bias", bf.resolve_layer(layer))  # (H, T)
    heads = maps.shape[0]
    name = literal(scheme_name(bf.scheme))
    size = font_sizes(sub.get_figure(root=True).get_figwidth())
    sub.suptitle(f"{name} ({note})" if note else name, fontsize=size["base"], fontweight="bold")
    if sub.get_figure(root=True).get_figwidth() < NARROW:
        grid = sub.subplot_mosaic([["first", "last"], ["profile", "profile"]], height_ratios=[1, 1.1])
    else:
        grid = sub.subplot_mosaic([["first", "last", "profile"]], width_ratios=[1, 1, 1.25])
    axes = [grid["first"], grid["last"], grid["profile"]]
    for ax, h in zip(axes[:2], (0, heads - 1), strict=True):
        head_heatmap(maps[h], ax=ax, kind="bias", seq_len=bf.seq_len, title=f"Head {h + 1}",
                     tick_step=tick_step_for(bf.seq_len) * 2)  # fmt: skip
        _label_colorbar(ax.images[0].colorbar, colorbar_label("bias"))
        ax.set_xlabel("key $j$")
        ax.set_ylabel("query $i$")
    _profiles(sub, axes[2], mean, train_len, size["tick"])


def _profiles(sub: SubFigure, ax: Axes, mean: np.ndarray, train_len: int | None, tick: float) -> None:
    """Every head's b(d) on a log distance axis (d >= 1), the training length marked, a colorbar of heads."""
    heads = mean.shape[0]
    d = np.arange(mean.shape[-1])
    cmap = _head_colours(heads)
    for h in range(heads):  # a log distance axis: the training length and 100x past it both get room
        ax.plot(d[1:], mean[h, 1:], color=cmap.to_rgba(h + 1), linewidth=0.8)
    if train_len:
        ax.axvline(train_len, color="0.3", linewidth=0.6, linestyle="--")
        ax.annotate("training length", (train_len, 0.05), xycoords=("data", "axes fraction"), xytext=(-2, 0),
                    textcoords="offset points", ha="right", va="bottom", rotation=90, fontsize=tick,
                    color="0.3")  # fmt: skip
    ax.set_xscale("log")
    ax.set_xlim(1, d[-1])
    ax.xaxis.set_major_locator(LogLocator(base=100))  # 1, 100, 10000: plain numbers that never touch
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("distance $d = i - j$ (log)")
    ax.set_ylabel("mean bias $b(d)$")
    ax.set_title("Every head")
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
    p.add_argument("--width", default=None, help="column, page or a width in inches (as plot --width)")
    args = p.parse_args(argv)
    style = with_width(args.style, args.width)
    files = [open_bias_file(f) for f in args.files]
    try:
        fig = long_context_figure(files, train_len=args.train_len, style=style)
        for path in save_figure(fig, args.out, parse_formats(args.format), style=style):
            print(f"wrote {path}")
    finally:
        for f in files:
            f.close()


if __name__ == "__main__":
    main()
