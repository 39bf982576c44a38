"""Positional logits of several schemes side by side, at the training length and far past it (SPEC section 12).

``python -m biasviz.plotting.positional_compare SHORT.h5 LONG.h5 [SHORT.h5 LONG.h5 ...] --out STEM`` takes
summary pairs of one model each (the same model at two lengths, two samples or more) and draws one column per
model: its most positional head's P(i, j) at the short length and at the long one, and every head's P(d)
at the long length. P is what position alone gives a score, measured the same way for a bias (ALiBi, KERPLE,
FIRE, T5, CABLE), a rotation (RoPE) or nothing at all (NoPE): the comparison the CABLE paper makes in words.
Each head is drawn relative to its own P at distance 0 (the softmax ignores a constant per query row).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colorbar import Colorbar
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from biasviz.common.errors import BiasvizError
from biasviz.plotting.positional import need_position
from biasviz.plotting.scales import ValueRange, _decimals, colour_scale, format_colorbars, tick_text
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, literal, paper_context, wrap_title
from biasviz.plotting.titles import figure_title, samples_text


def _read(path: Path) -> tuple[str, int, int, np.ndarray, np.ndarray, int]:
    """(scheme, T, samples, P map relative to P(0) (H, nb, nb), P(d) - P(0) over all keys (H, T), block)."""
    from biasviz.store import open_bias_file

    with open_bias_file(path, isolated=True) as bf:
        layer = need_position(bf, -1, "positional logits")
        profile = bf.summary_array("positional_profile", layer)[0]  # (H, T)
        p_map = bf.summary_map("positional_mean", layer) - profile[:, :1, None]
        return bf.scheme, bf.seq_len, bf.n_samples, p_map, profile - profile[:, :1], bf.block or 1


#: What every map's colour bar shows (its quantity, in logits), on lines that fit a seventh of a page.
BAR_LABEL = "P(i, j) − P(0)\n(logits)"


def _map(fig: Figure, ax: Axes, m: np.ndarray, t: int, block: int, size: float, first: bool) -> Colorbar:
    """One head's P map on :func:`colour_scale` (the heatmaps' one decision, from every cell the file holds: block
    means where it holds blocks, and the bar says so), with its labelled colour bar below."""
    norm, cmap = colour_scale(ValueRange.of(m, percentile=False), "positional")
    image = ax.imshow(m, cmap=cmap, norm=norm, extent=(0, t, t, 0), interpolation="nearest")
    image.set_rasterized(True)
    ax.set_xticks([0, t])
    ax.set_yticks([0, t])
    ax.tick_params(labelsize=size * 0.8, length=2, pad=1)
    ax.set_xlabel("key j", fontsize=size * 0.8, labelpad=0)
    if first:  # the row's length, and block means where the file holds no finer maps
        blocks = f"\n{block} × {block} block means" if block > 1 else ""
        ax.set_ylabel(f"T = {t}{blocks}\nquery i", fontsize=size * 0.85)
    bar = fig.colorbar(image, ax=ax, location="bottom", shrink=0.95, aspect=10, pad=0.02)
    bar.set_label(BAR_LABEL, fontsize=size * 0.7, labelpad=1)
    bar.ax.tick_params(labelsize=size * 0.7, length=2, pad=1)
    return bar


def _profile_decimals(axes: list[Axes]) -> int:
    """Decimals that write every tick of the profile axes exactly (the figure's one format takes at least these)."""
    ticks = [float(v) for ax in axes for v in ax.get_yticks() if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
    return max((_decimals(v) for v in ticks), default=0)


def _title(first: tuple[Path, Path], columns: list, note: str) -> str:
    """:func:`figure_title` of the comparison: the layer and samples of the first model, both lengths."""
    from biasviz.store import open_bias_file

    with open_bias_file(first[1], isolated=True) as bf:
        layer, n_layers = bf.resolve_layer(-1), bf.n_layers
    (short, long), n = columns[0], columns[0][1][2]
    return figure_title("Positional logits P(i, j) − P(d = 0), the most positional head", layer=layer,
                        n_layers=n_layers, seq_len=f"{short[1]} (training length) and {long[1]}",
                        which=samples_text(n), details=[note or None])  # fmt: skip


def compare_figure(pairs: list[tuple[Path, Path]], *, style: str = DEFAULT_STYLE, note: str = "") -> Figure:
    columns = [(_read(short), _read(long)) for short, long in pairs]
    with paper_context(style) as width:
        width = width or 6.75
        size = font_sizes(width)["base"]
        cols = len(columns)
        panel = width / cols
        title = _title(pairs[0], columns, note)
        wrapped = wrap_title(title, width, size)
        fig = Figure(figsize=(width, 3 * panel + 1.3 + 0.15 * wrapped.count("\n")), layout="constrained")
        axes = fig.subplots(3, cols, squeeze=False)
        bars = []
        for c, (short, long) in enumerate(columns):
            scheme, t_long, n, map_long, prof_long, _ = long
            head = int(np.nanargmax(np.nanmax(prof_long, -1) - np.nanmin(prof_long, -1)))  # the widest P(d)
            for r, (t, m, block) in enumerate(((short[1], short[3], short[5]), (t_long, map_long, long[5]))):
                bars.append(_map(fig, axes[r, c], m[head], t, block, size, first=c == 0))
            axes[0, c].set_title(f"{literal(scheme)}\nhead {head + 1}", fontsize=size)
            ax = axes[2, c]
            d = np.arange(1, t_long)
            for h in range(prof_long.shape[0]):
                ax.plot(d, prof_long[h, 1:], lw=1.2 if h == head else 0.5, color="C3" if h == head else "0.55",
                        zorder=3 if h == head else 2)  # fmt: skip
            ax.set_xscale("log")
            ax.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 5, 10]))
            ax.tick_params(labelsize=size * 0.8, length=2, pad=1)
            if c == 0:
                ax.set_ylabel("P(d) − P(0), logits", fontsize=size * 0.85)
        profiles = list(axes[2])
        # a seventh of a page holds two labels: the ends alone (0 is the diverging map's white), one format throughout
        decimals = format_colorbars(bars, nbins=-1, at_least=_profile_decimals(profiles))
        for ax in profiles:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_text(v, decimals)))
        xlabel = (
            f"bottom: P(d) − P(0) by distance d = i − j, every head at "
            f"T = {columns[0][1][1]} (the mapped head in red)"
        )
        fig.supxlabel(wrap_title(xlabel, width, size * 0.9), fontsize=size * 0.9)
        fig.suptitle(wrapped, fontsize=size)
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="summary files in pairs: the short length, then the long")
    p.add_argument("--out", type=Path, required=True, help="output stem: STEM.pdf and STEM.png")
    p.add_argument("--note", default="", help="a clause added to the title (where the models come from)")
    args = p.parse_args(argv)
    try:
        if len(args.files) % 2:
            raise BiasvizError("give the summary files in pairs: each model at the short length, then the long")
        from biasviz.plotting.save import save_figure

        pairs = list(zip(args.files[0::2], args.files[1::2], strict=True))
        fig = compare_figure(pairs, note=args.note)
        written = save_figure(fig, args.out, ["pdf", "png"], dpi=300,
                              info={"title": "Positional logits side by side", "source": " ".join(map(str, args.files)),
                                    "keywords": "biasviz; positional logits; comparison"})  # fmt: skip
    except BiasvizError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
