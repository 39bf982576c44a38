"""Drawings of the context-independence diagnostics: per-head metrics across schemes, distance profiles.

The metric plot uses a symmetric-log axis with its linear part near 0, so an exact 0 (the same bias
for every input, or a bias that depends on i - j alone) sits on the zero line while any nonzero
value stands clearly above it; exact zeros are drawn hollow.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure, SubFigure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullFormatter

from biasviz.diagnostics.measures import HeadDiagnostics
from biasviz.plotting.heatmap import figure_width_in, grid_shape, tick_step_for
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, paper_context, wrap_title

#: Okabe-Ito colours (distinguishable with colour-vision deficiencies) and one marker per scheme.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#000000", "#F0E442")
MARKERS = ("o", "s", "D", "^", "v", "P", "X", "h")
#: Below this the metric axis is linear; every reported nonzero value of interest lies far above it.
LINTHRESH = 1e-3
#: The metrics are ratios of float32 sums: values below this are rounding (ALiBi's separability gives ~4e-8),
#: drawn as 0, hollow, like exact zeros. JSON keeps the value as computed.
NOISE = 1e-6
#: Each row's metric, named and said in a few words (README, "Reading the figures and diagnostics").
METRICS = (("context_dependence", "Context dependence\n(spread over inputs)"),
           ("toeplitz_residual", "Toeplitz residual\n(off the $i - j$ means)"),
           ("separability_residual", "Separability residual\n(off $s_i - s_j$)"))  # fmt: skip
#: Below this width (inches: a paper's column) the rows are too short for the explanations: names alone.
NARROW = 4.0
#: The sink row's label, and each label's short form for narrow figures.
SINK_LABEL = "Sink share\n(mean weight on key 0)"
SHORT = {label: label.split("\n")[0].replace(" ", "\n", 1) for label in (*(m[1] for m in METRICS), SINK_LABEL)}
#: What every metric is relative to, said once on the figure (the README gives the definitions).
RELATIVE_TO = "each relative to the head's spread over cells"


def diagnostics_figure(results: Mapping[str, Sequence[HeadDiagnostics]], *, fig: Figure | SubFigure | None = None,
                       style: str | None = DEFAULT_STYLE, details: Mapping[str, str] | None = None,
                       title: str | None = None, sinks: Mapping[str, Sequence[float]] | None = None,
                       epsilon: float = 0.3) -> Figure | SubFigure:  # fmt: skip
    """One row per metric (context dependence, Toeplitz and separability residuals), a marker per scheme and head.

    ``details``: per scheme, what it was measured on (length, samples): said once in the title when every
    scheme shares it, else in each legend entry. ``title``: what the figure shows (the layer), before that.
    ``sinks``: per scheme (a key of ``results``), each head's mean attention weight on key 0 (docs/positional.md):
    drawn in a fourth row on a linear 0-1 axis with the sink threshold ``epsilon`` (Gu et al. 2025).
    """
    details = dict(details or {})
    shared = set(details.values())
    sinks = {name: share for name, share in (sinks or {}).items() if name in results}
    with _context(style) as width:
        if fig is None:
            width = width or 6.0
            rows = len(METRICS) + bool(sinks)
            fig = Figure(figsize=(width, max(0.3 * rows * width, 0.85 * rows + 1.4)), layout="constrained")
        axes = fig.subplots(len(METRICS) + bool(sinks), 1, sharex=True, squeeze=False)[:, 0]
        painter = _MetricPainter(results, narrow=figure_width_in(fig) < NARROW)
        painter.paint(axes[: len(METRICS)])
        if sinks:
            painter.paint_sinks(axes[-1], sinks, epsilon)
        painter.head_axis(axes[-1])
        one = len(shared) == 1 and len(details) == len(results)
        handles = [_legend_handle(k, name, heads, None if one else details.get(name))
                   for k, (name, heads) in enumerate(results.items())]  # fmt: skip
        if handles:
            handles.append(Line2D([], [], color="0.35", marker="o", markerfacecolor="white", linestyle="none",
                                  markersize=4, label=f"hollow: 0 (below {NOISE:.0e}, rounding)"))  # fmt: skip
            fig.legend(handles=handles, loc="outside lower center", ncol=_legend_columns(handles, fig, most=8),
                       frameon=False, handletextpad=0.3, columnspacing=1.0)  # fmt: skip
        heading = "; ".join(x for x in (title, next(iter(shared)) if one else None, RELATIVE_TO) if x)
        if heading:
            size = font_sizes(figure_width_in(fig))["base"] if style else None
            fig.suptitle(wrap_title(heading, figure_width_in(fig), size), fontsize=size)
    return fig


def _legend_columns(handles: Sequence[Line2D], fig: Figure | SubFigure, most: int = 5) -> int:
    """As many columns (at most ``most``) as the longest labels allow within the figure's width."""
    import matplotlib as mpl
    from matplotlib.font_manager import FontProperties

    size = FontProperties(size=mpl.rcParams["legend.fontsize"]).get_size_in_points()
    budget = figure_width_in(fig) * 72 / (0.5 * size)  # characters a row holds (half an em each)
    widths = sorted((len(h.get_label()) + 5 for h in handles), reverse=True)  # + marker and spacing
    ncol = min(len(handles), most)
    while ncol > 1 and sum(widths[:ncol]) > budget:
        ncol -= 1
    return ncol


def profile_axes(diag: HeadDiagnostics, *, ax: Axes | None = None, color: str = PALETTE[0],
                 title: str | None = None, start: int = 0, log: bool = False, log_distance: bool = False,
                 nonnegative: bool = False) -> Axes:  # fmt: skip
    """Mean against distance d = i - j with a band of +-1 std (over samples and positions).

    ``start``: the distance of the first entry (negative for a bidirectional model's profile); ``log``: a
    logarithmic value axis (attention weights), on which the band is cut at a tenth of the mean;
    ``nonnegative``: a quantity that is never below 0 (attention weights), whose band stops at 0.
    """
    if ax is None:
        ax = Figure(figsize=(3.0, 2.2), layout="constrained").add_subplot()
    mean, std = diag.profile_mean, diag.profile_std
    d = np.arange(mean.size) + start
    lo, hi = mean - std, mean + std
    if nonnegative:
        lo = np.maximum(lo, 0.0)
    if log:
        lo = np.maximum(lo, 0.1 * mean)
        ax.set_yscale("log")
    ax.fill_between(d, lo, hi, color=color, alpha=0.3, linewidth=0, label="±1 std")
    ax.plot(d, mean, color=color, linewidth=0.9, label="mean")
    ax.set_xlim(d[0], max(d[-1], d[0] + 1))
    if log_distance:  # symmetric-log: d = 0 (and a bidirectional model's negative distances) stay on the axis
        ax.set_xscale("symlog", linthresh=1.0, linscale=0.4)
    else:
        step = tick_step_for(mean.size)
        ax.set_xticks(np.arange(-(-d[0] // step) * step, d[-1] + 1, step))  # multiples of the step, 0 among them
    ax.tick_params(width=0.5, length=2.0, pad=1.5)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    ax.set_title(title if title is not None else f"Head {diag.head}")
    return ax


def profile_grid(results: Sequence[HeadDiagnostics], *, fig: Figure | SubFigure | None = None,
                 style: str | None = DEFAULT_STYLE, color: str = PALETTE[0], ylabel: str = "Bias (mean ± 1 std)",
                 suptitle: str | None = None, start: int = 0, log: bool = False,
                 log_distance: bool = False, nonnegative: bool = False) -> Figure | SubFigure:  # fmt: skip
    """Distance profiles of every head, 3 per row like the heatmap grid (``suptitle``: one line above them)."""
    with _context(style) as width:
        rows, cols = grid_shape(len(results))
        if fig is None:
            width = width or 6.0
            extra = 0.17 * (wrap_title(suptitle, width).count("\n") + 1) if suptitle else 0.0
            fig = Figure(figsize=(width, rows * width / cols * 0.62 + 0.3 + extra), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True).ravel()
        for ax, diag in zip(axes, results, strict=False):
            profile_axes(diag, ax=ax, color=color, start=start, log=log, log_distance=log_distance,
                         nonnegative=nonnegative)
        for ax in axes[len(results) :]:
            ax.set_visible(False)
        size = font_sizes(figure_width_in(fig))["base"]
        fig.supxlabel("Distance $i - j$", fontsize=size)
        fig.supylabel(ylabel, fontsize=size)
        if suptitle:
            fig.suptitle(wrap_title(suptitle, figure_width_in(fig), size), fontsize=size)
    return fig


# -- helpers ----------------------------------------------------------------------------------------


def _context(style: str | None) -> contextlib.AbstractContextManager[float | None]:
    return paper_context(style) if style else contextlib.nullcontext(None)


def _break_mark(ax: Axes, y: float) -> None:
    """Two short slanted strokes across both vertical spines at data height ``y``: the scale changes there."""
    from matplotlib.transforms import ScaledTranslation, blended_transform_factory

    at = blended_transform_factory(ax.transAxes, ax.transData)
    for x in (0.0, 1.0):
        where = ax.figure.dpi_scale_trans + ScaledTranslation(x, y, at)  # inches around (x, y)
        for dy in (-1.3, 1.3):  # points
            ax.add_line(Line2D([-3.5 / 72, 3.5 / 72], [(dy - 1.6) / 72, (dy + 1.6) / 72], color="0.15",
                               linewidth=0.6, transform=where, clip_on=False))  # fmt: skip


def _legend_handle(k: int, name: str, heads: Sequence[HeadDiagnostics], detail: str | None = None) -> Line2D:
    missing = any(h.context_dependence is None for h in heads)
    n = heads[0].samples if heads else 0
    notes = [detail] if detail else []
    if missing:
        notes.append(f"dependence n/a: {n} sample{'s' * (n != 1)}" if detail is None or n >= 2 else "dependence n/a")
    label = f"{name} ({'; '.join(notes)})" if notes else name
    return Line2D([], [], color=PALETTE[k % len(PALETTE)], marker=MARKERS[k % len(MARKERS)], linestyle="none",
                  markersize=4, label=label)  # fmt: skip


class _MetricPainter:
    """Places each scheme's per-head values side by side (dodged) on a symlog axis."""

    def __init__(self, results: Mapping[str, Sequence[HeadDiagnostics]], narrow: bool = False) -> None:
        self.results = results
        self.narrow = narrow  # a column's width: each row's label is its name alone
        self.n_heads = max((len(h) for h in results.values()), default=0)

    def paint(self, axes: Sequence[Axes]) -> None:
        n = max(len(self.results), 1)
        offsets = (np.arange(n) - (n - 1) / 2) * min(0.7 / n, 0.18)
        for ax, (key, label) in zip(axes, METRICS, strict=True):
            top = 0.0
            for k, (_name, heads) in enumerate(self.results.items()):
                top = max(top, self._scheme(ax, key, k, heads, offsets[k]))
            self._axis(ax, label, top)

    def paint_sinks(self, ax: Axes, sinks: Mapping[str, Sequence[float]], epsilon: float) -> None:
        """Each head's mean weight on key 0, a scheme's marker and colour as in the rows above; a linear axis
        (a share, 0 to 1) with the threshold above which Gu et al. (2025) call a head a sink."""
        n = max(len(self.results), 1)
        offsets = (np.arange(n) - (n - 1) / 2) * min(0.7 / n, 0.18)
        for k, name in enumerate(self.results):
            if name not in sinks:
                continue
            share = np.asarray(sinks[name], dtype=float)
            ax.plot(np.arange(1, share.size + 1) + offsets[k], share, linestyle="none",
                    marker=MARKERS[k % len(MARKERS)], markersize=3.5, color=PALETTE[k % len(PALETTE)])  # fmt: skip
        ax.axhline(epsilon, color="0.3", linewidth=0.6, linestyle=(0, (3, 2)), zorder=0)
        ax.annotate(f"sink: > {epsilon:g}", (1.0, epsilon), xycoords=("axes fraction", "data"), xytext=(-2, 2),
                    textcoords="offset points", ha="right", va="bottom", fontsize="small", color="0.3")  # fmt: skip
        ax.set_ylim(0.0, 1.0)
        for h in range(1, self.n_heads):
            ax.axvline(h + 0.5, color="0.85", linewidth=0.4, zorder=0)
        ax.set_xlim(0.5, self.n_heads + 0.5)
        ax.set_ylabel(SHORT[SINK_LABEL] if self.narrow else SINK_LABEL)
        ax.tick_params(width=0.5, length=2.0, pad=1.5)

    def head_axis(self, ax: Axes) -> None:
        ax.set_xlabel("Head")
        ax.set_xticks(np.arange(1, self.n_heads + 1))

    @staticmethod
    def _scheme(ax: Axes, key: str, k: int, heads: Sequence[HeadDiagnostics], offset: float) -> float:
        x = np.array([h.head for h in heads], dtype=float) + offset
        y = np.array([np.nan if getattr(h, key) is None else getattr(h, key) for h in heads], dtype=float)
        color, marker = PALETTE[k % len(PALETTE)], MARKERS[k % len(MARKERS)]
        zero = np.abs(y) < NOISE  # float32 rounding is no structure: drawn as the 0 it stands for
        ax.plot(x[~zero], y[~zero], linestyle="none", marker=marker, markersize=3.5, color=color)
        ax.plot(x[zero], y[zero], linestyle="none", marker=marker, markersize=3.5, markerfacecolor="white",
                markeredgecolor=color, markeredgewidth=0.8)  # fmt: skip
        finite = y[np.isfinite(y)]
        return float(finite.max()) if finite.size else 0.0

    def _axis(self, ax: Axes, label: str, top: float) -> None:
        ax.set_yscale("symlog", linthresh=LINTHRESH, linscale=0.6)
        upper = max(10 ** np.ceil(np.log10(max(top, LINTHRESH * 10)) + 0.05), LINTHRESH * 10)
        ax.set_ylim(-LINTHRESH * 0.4, upper)
        ax.yaxis.set_minor_formatter(NullFormatter())
        _break_mark(ax, 0.5 * LINTHRESH)  # the axis turns from linear (the 0) to logarithmic here
        ax.axhline(0.0, color="0.3", linewidth=0.5, zorder=0)
        for h in range(1, self.n_heads):
            ax.axvline(h + 0.5, color="0.85", linewidth=0.4, zorder=0)
        ax.set_xlim(0.5, self.n_heads + 0.5)
        ax.set_ylabel(SHORT[label] if self.narrow else label)
        ax.tick_params(width=0.5, length=2.0, pad=1.5)


__all__ = ["diagnostics_figure", "profile_axes", "profile_grid", "PALETTE", "MARKERS", "LINTHRESH", "NOISE"]
