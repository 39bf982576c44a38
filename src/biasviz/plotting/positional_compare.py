"""Positional logits of several schemes side by side, at the training length and far past it (docs/positional.md).

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
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure, SubFigure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from biasviz.common.errors import BiasvizError
from biasviz.plotting.measures_plots import Z95
from biasviz.plotting.positional import need_position
from biasviz.plotting.scales import ValueRange, _decimals, format_colorbars, head_scales, tick_text
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, literal, paper_context, wrap_title
from biasviz.plotting.titles import figure_title, made_by, samples_text, scheme_name
from biasviz.store.datasets import POSITIONAL_MEAN, POSITIONAL_PROFILE, se_name


def _read(path: Path) -> tuple[str, int, int, np.ndarray, np.ndarray, int, np.ndarray | None]:
    """(scheme, T, samples, P map relative to P(0) (H, nb, nb), P(d) - P(0) over all keys (H, T), block, the SE of
    P(d) over all keys (H, T) where the file holds one, else None)."""
    from biasviz.store import open_bias_file

    with open_bias_file(path, isolated=True) as bf:
        layer = need_position(bf, -1, "positional logits")
        profile = bf.summary_array(POSITIONAL_PROFILE, layer)[0]  # (H, T)
        p_map = bf.summary_map(POSITIONAL_MEAN, layer) - profile[:, :1, None]
        se = (bf.summary_array(se_name(POSITIONAL_PROFILE), layer)[0]
              if bf.summary.holds(layer, se_name(POSITIONAL_PROFILE)) else None)  # fmt: skip
        return bf.scheme, bf.seq_len, bf.n_samples, p_map, profile - profile[:, :1], bf.block or 1, se


#: What every map's colour bar shows (its quantity, in logits), on lines that fit a seventh of a page.
BAR_LABEL = "P(i, j) − P(0)\n(logits)"
#: Models side by side below 4 in (a column): more would leave maps a third of an inch wide and labels below 6 pt;
#: the rest go in further blocks below.
NARROW_COLUMNS = 4


def _map(fig: Figure | SubFigure, ax: Axes, m: np.ndarray, t: int, block: int, size: float, first: bool,
         positions: bool, scale: tuple[Normalize, Colormap]) -> Colorbar:  # fmt: skip
    """One head's P map on its ``scale`` (:func:`_scales`), with its labelled colour bar below. ``positions``: the
    query positions written on the left (the first map of a row, or one whose length differs from the first's)."""
    norm, cmap = scale
    image = ax.imshow(m, cmap=cmap, norm=norm, extent=(0, t, t, 0), interpolation="nearest")
    image.set_rasterized(True)
    ax.set_xticks([0, t])
    ax.set_yticks([0, t])
    for label, align in zip(ax.get_xticklabels(), ("left", "right"), strict=True):
        label.set_horizontalalignment(align)  # inside the map's width: "2048" reaches no neighbour
    ax.tick_params(labelsize=size * 0.8, length=2, pad=1, labelleft=positions)
    ax.set_xlabel("key j", fontsize=size * 0.8, labelpad=0)
    if first:  # the row's length, and block means where the file holds no finer maps
        blocks = f"\n{block} × {block} block means" if block > 1 else ""
        ax.set_ylabel(f"T = {t}{blocks}\nquery i", fontsize=size * 0.85)
    bar = fig.colorbar(image, ax=ax, location="bottom", shrink=0.95, aspect=10, pad=0.02)
    small = max(6.0, size * 0.7)  # never below 6 pt in print (FIGURES.md item 6)
    bar.set_label(BAR_LABEL, fontsize=small, labelpad=1)
    bar.ax.tick_params(labelsize=small, length=2, pad=1)
    return bar


def _end_labels(fig: Figure, bars: list[Colorbar], size: float) -> float:
    """Each bar's two end labels inside its ends: the minimum from the left end rightwards, the maximum from the
    right end leftwards, so that none reaches a neighbouring column. Where some bar is too short to hold both on
    one line with a gap of half an em (a seventh of a 5.5 in page gives a bar about 40 points), every bar's
    maximum goes one line lower: the figure keeps one layout, and the labels never meet. Returns the inches each
    row of maps needs for that line (0: none)."""
    ends = []
    for cb in bars:
        ticks = cb.ax.xaxis.get_major_ticks(len(cb.get_ticks()))
        if len(ticks) < 2:
            continue
        ticks[0].label1.set_horizontalalignment("left")
        ticks[-1].label1.set_horizontalalignment("right")
        ends.append((ticks[0], ticks[-1]))
    if not ends:
        return 0.0
    fig.draw_without_rendering()  # the layout: where each bar and label is
    gap = 0.5 * size * fig.dpi / 72
    if not any(lo.label1.get_window_extent().x1 + gap > hi.label1.get_window_extent().x0 for lo, hi in ends):
        _clear_zeros(fig, bars, gap)
        return 0.0
    step = 1.2 * ends[0][1].label1.get_fontsize()
    for _, hi in ends:
        hi.set_pad(hi.get_pad() + step)
    _clear_zeros(fig, bars, gap)
    return step / 72


def _clear_zeros(fig: Figure, bars: list[Colorbar], gap: float) -> None:
    """A diverging bar's 0 keeps its tick mark but loses its label where the label would touch an end's (a
    one-sign map's long end label, "−1285.4", reaches the middle of a bar a seventh of a page long); the white of
    the map marks 0 there, and the figure's label says what the bars show."""
    fig.draw_without_rendering()
    for cb in bars:
        ticks = cb.ax.xaxis.get_major_ticks(len(cb.get_ticks()))
        if len(ticks) != 3:
            continue
        middle = ticks[1].label1.get_window_extent()
        for end in (ticks[0], ticks[2]):
            box = end.label1.get_window_extent()
            if box.x0 - gap < middle.x1 and middle.x0 < box.x1 + gap and box.y0 < middle.y1 and middle.y0 < box.y1:
                labels = [t.get_text() for t in cb.ax.get_xticklabels()]
                cb.ax.xaxis.set_ticklabels([*labels[:1], "", *labels[2:]])  # the formatter's, kept at every draw
                break


def _profile_decimals(axes: list[Axes]) -> int:
    """Decimals that write every tick of the profile axes exactly (the figure's one format takes at least these)."""
    ticks = [float(v) for ax in axes for v in ax.get_yticks() if ax.get_ylim()[0] <= v <= ax.get_ylim()[1]]
    return max((_decimals(v) for v in ticks), default=0)


def _title(first: tuple[Path, Path], columns: list, note: str) -> str:
    """:func:`figure_title` of the comparison: the layer and samples of the first model, both lengths."""
    from biasviz.store import open_bias_file

    with open_bias_file(first[1], isolated=True) as bf:
        layer, n_layers = bf.resolve_layer(-1), bf.n_layers
        by = made_by(bf, layer)
    (short, long), n = columns[0], columns[0][1][2]
    return figure_title("Positional logits P(i, j) − P(d = 0), the most positional head", layer=layer,
                        n_layers=n_layers, seq_len=f"{short[1]} (training length) and {long[1]}",
                        which=samples_text(n), details=[note or None], made_by=by)  # fmt: skip


def _sizes(width: float, per_row: int, size: float, title: str, xlabel: str) -> tuple[float, list[float]]:
    """The figure's height beyond its parts and the heights of the parts (each block's maps, then its profiles),
    in inches, from the side a map gets across ``width``: the layout keeps the maps square without shrinking them
    to fit a height. Room for one line of bar labels; :func:`_end_labels` adds a line where they are staggered."""
    line = size / 72
    side = (width - 7 * line - (per_row - 1) * 0.1) / per_row  # the first column's labels: about 7 lines
    # titles; per row: the map and its bar's share of the cell, then ticks, "key j", the bar's ends and label (a
    # first guess: compare_figure makes the rows as tall as the laid-out maps are wide)
    maps = 2.4 * line + 2 * (1.15 * side + 6 * line)
    profiles = 0.75 * side + 2.5 * line
    return (title.count("\n") + 1) * 1.3 * line + (xlabel.count("\n") + 1) * 1.2 * line + 0.15, [maps, profiles]


def compare_figure(pairs: list[tuple[Path, Path]], *, style: str = DEFAULT_STYLE, note: str = "") -> Figure:
    """One column per model (its most positional head at both lengths, every head's P(d) below), in blocks of
    :data:`NARROW_COLUMNS` at a column's width; profiles in figures of their own, so that their value labels take
    no width from the maps above them."""
    columns = [(_read(short), _read(long)) for short, long in pairs]
    with paper_context(style) as width:
        width = width or 6.75
        size = font_sizes(width)["base"]
        per_row = len(columns) if width >= 4.0 else min(len(columns), NARROW_COLUMNS)
        starts = range(0, len(columns), per_row)
        wrapped = wrap_title(_title(pairs[0], columns, note), width, size)
        where = "below the maps" if len(starts) == 1 else "below each block's maps"
        banded = any(long[6] is not None for _, long in columns)
        band = ", shaded: the 95 % interval of its P(d) over samples" if banded else ""
        xlabel = wrap_title(f"{where}: P(d) − P(0) by distance d = i − j, every head at T = {columns[0][1][1]} "
                            f"(the mapped head in red{band})", width, size * 0.9)  # fmt: skip
        extra, (maps_h, profiles_h) = _sizes(width, per_row, size, wrapped, xlabel)
        heights = [maps_h, profiles_h] * len(starts)
        fig = Figure(figsize=(width, extra + sum(heights)), layout="constrained")
        grid = fig.add_gridspec(len(heights), 1, height_ratios=heights)
        parts = [fig.add_subfigure(grid[k]) for k in range(len(heights))]
        bars, profiles = [], []
        scales = _scales(columns)
        for k, start in enumerate(starts):
            maps = parts[2 * k].subplots(2, per_row, squeeze=False)
            below = parts[2 * k + 1].subplots(1, per_row, squeeze=False)[0]
            for c in range(per_row):
                if start + c >= len(columns):  # the last block's empty places keep the columns of those above
                    for ax in (maps[0, c], maps[1, c], below[c]):
                        ax.remove()
                    continue
                short, long = columns[start + c]
                head = _draw_column(parts[2 * k], maps[:, c], below[c], short, long, size, c == 0,
                                    [columns[start][0][1], columns[start][1][1]], bars,
                                    scales[start + c])  # fmt: skip
                maps[0, c].set_title(f"{literal(scheme_name(long[0]))}\nhead {head + 1}", fontsize=size)
                profiles.append(below[c])
        # a seventh of a page holds three labels: the ends and, on a diverging bar, its 0; one format throughout
        decimals = format_colorbars(bars, nbins=0, at_least=_profile_decimals(profiles))
        for ax in profiles:
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: tick_text(v, decimals)))
        fig.supxlabel(xlabel, fontsize=size * 0.9)
        fig.suptitle(wrapped, fontsize=size)
        maps_h += 2 * _end_labels(fig, bars, size)  # staggered ends: a line more under each row of maps
        for _ in range(4):  # each row of maps as tall as its maps are wide: none shrunk to fit, no wide blank band
            fig.set_figheight(extra + (maps_h + profiles_h) * len(starts))
            grid.set_height_ratios([maps_h, profiles_h] * len(starts))
            slack = _slack(parts[0].axes[0])
            if -0.01 <= slack <= 0.05:
                break
            maps_h -= 2 * (slack - 0.02) / 1.6  # a cell grows by about 1.6 times what its row is given
    return fig


def _slack(ax: Axes) -> float:
    """Inches by which the laid-out cell of map ``ax`` is taller (> 0) or shorter (< 0) than it is wide: a taller
    cell leaves a blank band, a shorter one shrinks its square map below the column's width."""
    root = ax.get_figure(root=True)
    root.draw_without_rendering()
    cell = ax.get_position(original=True).transformed(ax.get_figure(root=False).transSubfigure)
    return (cell.height - cell.width) / root.dpi


def _widest(long: tuple) -> int:
    """The head whose P(d) at the long length spans the most logits (0-based): the one a column maps."""
    prof_long = long[4]
    return int(np.nanargmax(np.nanmax(prof_long, -1) - np.nanmin(prof_long, -1)))


def _scales(columns: list) -> list[list[tuple[Normalize, Colormap]]]:
    """Each column's two maps' scales, decided for the figure as a whole (:func:`head_scales`: the heatmaps' one
    decision per map, from every cell the file holds, and one colour family for every map of the figure): a head
    diverging at one length is diverging at the other."""
    ranges = [ValueRange.of(part[3][_widest(long)], percentile=False) for short, long in columns
              for part in (short, long)]  # fmt: skip
    flat = head_scales([], "positional", ranges=ranges)
    return [flat[2 * c : 2 * c + 2] for c in range(len(columns))]


def _draw_column(fig: SubFigure, maps: np.ndarray, ax: Axes, short: tuple, long: tuple, size: float, first: bool,
                 lengths: list[int], bars: list[Colorbar],
                 scales: list[tuple[Normalize, Colormap]]) -> int:  # fmt: skip
    """One model: its widest head's P map at both lengths on ``scales`` (bars added to ``bars``) and every head's
    P(d) at the long length on ``ax``, the mapped head in red over its 95 % interval where the file holds P(d)'s SE
    (one band: twelve would hide the lines). Returns the head drawn (0-based)."""
    t_long, prof_long = long[1], long[4]
    head = _widest(long)
    for r, (t, m, block) in enumerate(((short[1], short[3], short[5]), (t_long, long[3], long[5]))):
        bars.append(_map(fig, maps[r], m[head], t, block, size, first, positions=first or t != lengths[r],
                         scale=scales[r]))  # fmt: skip
    d = np.arange(1, t_long)
    se = long[6]
    if se is not None:  # the mapped head's P(d) with its 95 % interval (positional_profile_se, over all keys)
        half = Z95 * se[head, 1:]
        ax.fill_between(d, prof_long[head, 1:] - half, prof_long[head, 1:] + half, color="C3", alpha=0.25, lw=0,
                        zorder=2.5)  # fmt: skip
    for h in range(prof_long.shape[0]):
        ax.plot(d, prof_long[h, 1:], lw=1.2 if h == head else 0.5, color="C3" if h == head else "0.55",
                zorder=3 if h == head else 2)  # fmt: skip
    ax.set_xscale("log")
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4, steps=[1, 2, 5, 10]))
    ax.tick_params(labelsize=size * 0.8, length=2, pad=1)
    if first:
        ax.set_ylabel("P(d) − P(0), logits", fontsize=size * 0.85)
    return head


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
