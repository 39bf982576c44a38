"""One page of docs/position-measures.md's measures for several models, from summary files (``extract --summary``).

``python -m biasviz.plotting.measures_page data/rope-pos-long.h5 data/alibi-pos-long.h5 --out STEM`` draws one row
per file (one column per file at a column's width): which rotary frequencies its heads use (Barbero et al., ICLR
2025; a model that rotates nothing says so in its panel), how its weight falls off with distance (band mass) and
where in the context it lands (the U-curve of Liu et al. 2024 and Hsieh et al. 2024), each with its 95 % band over
samples. Twelve heads with bands in one panel cannot be read, so each model shows three of its final layer's heads,
chosen from its band mass and the same in its three panels: the most local head (the largest weight on distances
0-15), the least local one, and the median between them. The title says what, where and on what in a line or two;
how to read the panels, which heads and what the bands are is in the caption (``--caption`` writes OUT.tex).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import LogLocator, MaxNLocator, NullFormatter

from biasviz.common.atomic import replacing_together
from biasviz.common.errors import BiasvizError
from biasviz.plotting.caption import caption_text, latex_escape, model_clauses, write_caption
from biasviz.plotting.diagnostics_plots import PALETTE
from biasviz.plotting.long_context import PLAIN
from biasviz.plotting.measures_plots import Z95, need_measure
from biasviz.plotting.save import parse_formats, save_figure
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, literal, paper_context, with_width, wrap_title
from biasviz.plotting.titles import (
    figure_title,
    layer_text,
    made_by,
    samples_text,
    scheme_name,
    sentence_case,
    trained_text,
)
from biasviz.store import open_bias_file
from biasviz.store.datasets import BAND_MASS, CONTEXT_MASS, DIRECT_DISTANCES, FREQUENCY_USE, SEGMENTS, se_name
from biasviz.store.reader import BiasFile

#: Below this width (inches: a paper's column) the files are columns and the measures rows.
NARROW = 4.0
#: The three heads' colours (colour-blind safe: blue, vermilion, bluish green) and what each is.
ROLES = (("most local", PALETTE[0]), ("median", PALETTE[5]), ("least local", PALETTE[2]))
MEASURES = ("frequency", "bands", "context")
#: The band-mass axis stops this far below its largest weight per distance (the title says so where it cuts:
#: "a millionth").
FLOOR = 1e-6
TITLES = ("Rotary frequency use", "Weight by distance", "Weight by place")


def chosen_heads(band_mass: np.ndarray, bins: np.ndarray) -> list[int]:
    """The most local head (largest summed weight on the distances below 16), the median one and the least local
    one, from ``band_mass`` (head, bin) means; indices from 0, in that order, each head once.

    >>> chosen_heads(np.array([[0.2, 0.1], [0.9, 0.0], [0.5, 0.3], [0.1, 0.8]]), np.array([[0, 0], [16, 20]]))
    [1, 0, 3]
    """
    local = np.nansum(np.where(bins[:, 1] < DIRECT_DISTANCES, band_mass, 0.0), axis=-1)
    order = [int(h) for h in np.argsort(-local, kind="stable")]
    picked = [order[0], order[len(order) // 2], order[-1]]
    return list(dict.fromkeys(picked))  # a model of one or two heads: each once


def measures_page(files: Sequence[BiasFile], *, train_len: int | None = None, style: str = DEFAULT_STYLE) -> Figure:
    """A row per file (a column at a column's width) of [frequency use, band mass, context mass] of three heads; a
    short title, and the details in its LaTeX caption, ``fig.biasviz_caption`` (:func:`caption`)."""
    lengths = {(bf.seq_len, bf.n_samples) for bf in files}
    if len(lengths) > 1:
        raise BiasvizError("the files hold different lengths or sample counts "
                           f"({', '.join(f'T = {t}, {n} samples' for t, n in sorted(lengths))}): one page shows one")
    with paper_context(style) as width:
        narrow = width < NARROW
        size = font_sizes(width)
        rows, cols = (len(MEASURES), len(files)) if narrow else (len(files), len(MEASURES))
        fig = Figure(figsize=(width, (1.55 if narrow else 1.75) * rows + 0.75), layout="constrained")
        grid = fig.subplots(rows, cols, squeeze=False)
        cut: list[str] = []  # the models whose weights by distance run below the axis's floor
        for k, bf in enumerate(files):
            layer = need_measure(bf, -1, BAND_MASS, f"the weight by distance ({BAND_MASS})")
            axes = grid[:, k] if narrow else grid[k, :]
            heads = chosen_heads(bf.summary_array(BAND_MASS, layer)[0], bf.summary.distance_bins())
            name = scheme_name(bf.scheme)  # plain: drawn through literal()
            _frequency(axes[0], bf, layer, heads, size["tick"])
            if _bands(axes[1], bf, layer, heads):
                cut.append(name)
            _context(axes[2], bf, layer, heads)
            for m, (ax, what) in enumerate(zip(axes, TITLES, strict=True)):
                if not narrow:  # a row per model: each panel names both
                    ax.set_title(f"{literal(name)}: {what}", fontsize=size["base"])
                elif m == 0:  # a column per model: its name on top, the measures on the y axes
                    ax.set_title(literal(name), fontsize=size["base"], fontweight="bold")
                if narrow and k > 0:
                    ax.set_ylabel("")
                ax.tick_params(labelsize=size["tick"])
            handles = [ax_line for ax_line in axes[2].lines if not str(ax_line.get_label()).startswith("_")]
            axes[2].legend(handles=handles, fontsize=size["tick"], loc="best", frameon=False, handlelength=1.2,
                           borderaxespad=0.2, labelspacing=0.25)  # fmt: skip
        fig.suptitle(wrap_title(_title(files, train_len), width, size["base"]), fontsize=size["base"])
    fig.biasviz_caption = caption(files, train_len, cut)  # type: ignore[attr-defined]  # (as biasviz.plot's figures)
    return fig


def _title(files: Sequence[BiasFile], train_len: int | None) -> str:
    """What the page shows, where and on what: one or two lines at a page's width (the rest is its caption)."""
    f0 = files[0]
    times = f" ({f0.seq_len / train_len:g}× the training length)" if train_len else ""
    notes = {trained_text(bf) for bf in files}
    return figure_title("Position as papers measure it", layer=f0.resolve_layer(-1), n_layers=f0.n_layers,
                        seq_len=f"{f0.seq_len}{times}", which=samples_text(f0.n_samples),
                        trained=notes.pop() if len(notes) == 1 else None,
                        made_by=made_by(f0, f0.resolve_layer(-1)))  # fmt: skip


#: The caption's reading of the page, in biasviz's own words (LaTeX).
READING = (r"Per model: the mean 2-norm of each rotary pair $f$ of $q$ (solid) and $k$ (dashed), $f = 0$ turning "
           r"fastest; the attention weight per distance $d = i - j$ (each bin's weight over its width), on log-log "
           r"axes; the weight on each tenth of the keys a query sees, earliest first (dotted: a uniform head's 0.1).",
           r"Three heads per model, the same in its three panels: the most local (the most weight on distances 0 to "
           r"15), the median and the least local.",
           r"Shaded: the 95\% interval of the mean over samples ($\pm 1.96$ standard errors).")  # fmt: skip


def caption(files: Sequence[BiasFile], train_len: int | None, cut: Sequence[str]) -> str:
    """The page's LaTeX caption (``--caption``): the details its short title leaves out, and each model as its file
    records it (values from the files escaped)."""
    f0 = files[0]
    times = f" (${f0.seq_len / train_len:g}\\times$ the training length)" if train_len else ""
    last = f0.resolve_layer(-1)
    where = f"{latex_escape(sentence_case(layer_text(last, f0.n_layers, made_by(f0, last))))}; $T = {int(f0.seq_len)}$"
    lines = [f"Position as papers measure it: rotary frequency use, weight by distance (band mass) and weight by "
             f"place in the context. {where}{times}; {latex_escape(samples_text(f0.n_samples))}.", *READING]
    for bf in files:
        said = "; ".join(model_clauses(bf, bf.scheme))  # 'Scheme \texttt{rope}; model ...; tiny model, ...'
        lines.append(f"{latex_escape(scheme_name(bf.scheme))}: {said[:1].lower()}{said[1:]}.")
    if cut:
        lines.append(f"{latex_escape(' and '.join(cut))}: weight by distance drawn down to a millionth of its "
                     "largest (the axis stops there; the smallest weights are far below).")  # fmt: skip
    return caption_text(lines, "plotting.measures_page")


def _line(ax: Axes, x: np.ndarray, mean: np.ndarray, se: np.ndarray | None, colour: str, label: str | None,
          dashes: str = "-") -> None:  # fmt: skip
    if se is not None:
        ax.fill_between(x, mean - Z95 * se, mean + Z95 * se, color=colour, alpha=0.22, lw=0)
    ax.plot(x, mean, dashes, color=colour, lw=0.9, label=label if label else "_")


def _se(bf: BiasFile, name: str, layer: int) -> np.ndarray | None:
    return bf.summary_array(se_name(name), layer) if bf.summary.holds(layer, se_name(name)) else None


def _frequency(ax: Axes, bf: BiasFile, layer: int, heads: list[int], tick: float) -> None:
    """q (solid) and k (dashed) norms of each rotary pair; a model that rotates nothing says so in the panel."""
    if not bf.summary.holds(layer, FREQUENCY_USE):
        ax.text(0.5, 0.5, "No rotary pairs:\nthis model rotates\nno q or k (its position\nis an additive bias)",
                transform=ax.transAxes, ha="center", va="center", fontsize=tick, color="0.3")  # fmt: skip
        ax.set_xticks([])
        ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_color("0.75")
        return
    use, se = bf.summary_array(FREQUENCY_USE, layer), _se(bf, FREQUENCY_USE, layer)
    said = bf.summary.rotary_pairs(layer)
    pairs = use.shape[-1] if said is None else said[0]
    x = np.arange(pairs)
    for h in heads:
        for o, dashes in ((0, "-"), (1, "--")):
            _line(ax, x, use[o, h, :pairs], None if se is None else se[o, h, :pairs], _colour(heads, h), None, dashes)
    ax.set_ylim(bottom=0)
    ax.xaxis.set_major_locator(MaxNLocator(nbins=5, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.set_xlabel("rotary pair $f$ (0: fastest)")
    ax.set_ylabel("mean norm of the pair")


def _bands(ax: Axes, bf: BiasFile, layer: int, heads: list[int]) -> bool:
    """Weight per distance (each bin's weight over its width) on log-log axes, as ``plot --kind bands``; whether
    the axis stops above the smallest weight (at :data:`FLOOR` times the largest)."""
    mean, se = bf.summary_array(BAND_MASS, layer)[0], _se(bf, BAND_MASS, layer)
    bins = bf.summary.distance_bins()
    width = (bins[:, 1] - bins[:, 0] + 1).astype(np.float64)
    x = bins.mean(axis=1) + 1
    for h in heads:
        _line(ax, x, mean[h] / width, None if se is None else se[h] / width, _colour(heads, h), None)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.xaxis.set_major_locator(LogLocator(base=10))
    ax.xaxis.set_major_formatter(PLAIN)
    ax.xaxis.set_minor_formatter(NullFormatter())
    high = np.nanmax(mean[heads] / width)
    low = np.nanmin(np.where(mean[heads] > 0, mean[heads] / width, np.inf))
    if low < FLOOR * high:  # ALiBi's far keys get weights down to float32's smallest: the axis stops at a floor
        ax.set_ylim(FLOOR * high, high * 2)  # (the margins of 40 decades would leave the curves a sliver)
    ax.yaxis.set_major_locator(LogLocator(base=10, numticks=4))
    ax.set_xlabel("distance $i - j$ + 1")
    ax.set_ylabel("weight per distance")
    return bool(low < FLOOR * high)


def _context(ax: Axes, bf: BiasFile, layer: int, heads: list[int]) -> None:
    """Weight on each tenth of the keys a query sees, earliest first; dotted, a uniform head's 0.1."""
    mean, se = bf.summary_array(CONTEXT_MASS, layer)[0], _se(bf, CONTEXT_MASS, layer)
    x = (np.arange(SEGMENTS) + 0.5) / SEGMENTS
    for role, h in zip(ROLES, heads, strict=False):
        _line(ax, x, mean[h], None if se is None else se[h], _colour(heads, h), f"head {h + 1}, {role[0]}")
    ax.axhline(1 / SEGMENTS, color="0.5", lw=0.6, ls=":")
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, 1)
    ax.yaxis.set_major_locator(MaxNLocator(nbins=4))
    ax.set_xticks([0, 0.5, 1], ["first", "middle", "last"])
    for label, align in zip(ax.get_xticklabels(), ("left", "center", "right"), strict=True):
        label.set_horizontalalignment(align)  # inside the panel's width: clear of the y axis's 0
    ax.set_xlabel("tenth of the keys seen")
    ax.set_ylabel("weight on the tenth")


def _colour(heads: list[int], h: int) -> str:
    return ROLES[heads.index(h)][1]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", type=Path, help="summary files (extract --summary) of one length each")
    p.add_argument("--out", type=Path, required=True, help="output path without extension")
    p.add_argument("--train-len", type=int, default=None, help="the models' training length, said in the title")
    p.add_argument("--format", default="pdf,png")
    p.add_argument("--style", default=DEFAULT_STYLE)
    p.add_argument("--width", default=None, help="column, page or a width in inches (as plot --width)")
    p.add_argument("--caption", action="store_true",
                   help="also write OUT.tex: a LaTeX \\caption{...} with what the short title leaves out")
    args = p.parse_args(argv)
    files: list[BiasFile] = []
    try:
        style = with_width(args.style, args.width)
        files += [open_bias_file(f, isolated=True) for f in args.files]
        fig = measures_page(files, train_len=args.train_len, style=style)
        info = {"title": "Position as papers measure it: rotary frequency use, band mass, context mass",
                "source": " ".join(map(str, args.files)),
                "keywords": f"biasviz; {FREQUENCY_USE}; {BAND_MASS}; {CONTEXT_MASS}; standard errors"}  # fmt: skip
        with replacing_together(args.files) as staged:  # the figures and caption replaced together, or not at all
            written = save_figure(fig, args.out, parse_formats(args.format), style=style, info=info, staged=staged)
            if args.caption:
                written.append(write_caption(args.out, fig.biasviz_caption, staged))
    except BiasvizError as exc:
        print(f"Error: {exc}", file=sys.stderr)
        return 1
    finally:
        for f in files:
            f.close()
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
