"""Figures of a checkpoint sweep: how each head's bias, and its diagnostics, change over training.

``dynamics_grid``: one panel per head (the 4 x 3 grid of the heatmaps), the distance profile b(d) (mean
over samples and cells with i - j = d) at each checkpoint, coloured by training step, one colorbar.
``over_training``: context dependence and Toeplitz residual of each head against the training step.

Both say in their title what they show (scheme, layer, length, samples, how the model was trained: the callers
know the file, :func:`sweep_title` words it), use one tick format (plain numbers without trailing zeros; powers
of ten on the metrics' logarithmic axes, as the diagnostics figure has them), and label fewer ticks at a
column's width rather than let labels touch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, MaxNLocator, NullFormatter

from biasviz.diagnostics.measures import HeadDiagnostics
from biasviz.plotting.diagnostics_plots import LINTHRESH, METRICS, NARROW, NOISE, PALETTE, SHORT, _break_mark, _context
from biasviz.plotting.heatmap import TrimmedFormatter, figure_width_in, grid_shape, tick_step_for
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, literal, wrap_title
from biasviz.plotting.titles import figure_title, made_by, samples_text, scheme_title, trained_note
from biasviz.store import BiasFile
from biasviz.store.h5io import json_attr

Sweep = Sequence[tuple[int, Sequence[HeadDiagnostics]]]  # (training step, one result per head), by step
STEP_CMAP = "plasma"
#: The step colours stop before the map's yellow end (plasma: dark blue, magenta, orange): a yellow line on white
#: is hard to see in print.
STEP_CMAP_END = 0.75
#: Up to this many checkpoints the steps get a legend entry each; beyond, a colorbar.
LEGEND_STEPS = 8


def step_colours(cmap: str = STEP_CMAP) -> Colormap:
    """``cmap`` cut at :data:`STEP_CMAP_END`: dark to mid-light, every colour visible on white."""
    return ListedColormap(colormaps[cmap](np.linspace(0.0, STEP_CMAP_END, 256)), name=f"{cmap}_steps")


def log_distance_axis(ax: object, first: int = 0) -> None:
    """A logarithmic distance axis that still holds d = 0 (linear below 1): short-range structure (T5's exact
    buckets below 16, say) gets as much room as the long tail."""
    ax.set_xscale("symlog", linthresh=1.0, linscale=0.4)  # type: ignore[attr-defined]
    if first >= 0:
        ax.set_xlim(left=0)  # type: ignore[attr-defined]


def sweep_title(bf: BiasFile, layer: int, scheme: str) -> str:
    """What a sweep's figure shows: scheme, layer, length, the samples its profiles average and how the model
    was trained (where the file says), in :func:`figure_title`'s words, e.g. 'kerple-log bias over training:
    final layer, 2 of 2; T = 512; mean of 4 samples and the cells at each distance; tiny model, checkpoints of 0
    to 300 training steps ...'."""
    n = bf.n_samples
    over = "the scheme's formula" if bf.bias_only else f"{samples_text(n)} and the cells"
    steps = [int(s) for s in bf.checkpoints or []]
    doc = json_attr(bf.attrs.get("training"))
    if isinstance(doc, dict) and steps:  # the steps the file holds, whatever one checkpoint's own record says
        doc = {**doc, "steps": steps}
    note = trained_note(json.dumps(doc)) if isinstance(doc, dict) else None
    note = literal(note) if note else f"checkpoints of {min(steps, default=0):,} to {max(steps, default=0):,} steps"
    return figure_title(f"{scheme_title(scheme)} bias over training", layer=layer, n_layers=bf.n_layers,
                        seq_len=bf.seq_len, which=f"{over} at each distance", trained=note,
                        made_by=made_by(bf, layer))  # fmt: skip


def _plain_ticks(ax: Axes, width: float, axis: str = "y") -> None:
    """The figure's one tick format on ``axis``: plain numbers without trailing zeros ('0', '-2.5', '-5')."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(MaxNLocator(nbins=3 if width < NARROW else 4))
    formatter = TrimmedFormatter(useOffset=False)
    formatter.set_powerlimits((-3, 5))
    target.set_major_formatter(formatter)


def _distance_ticks(ax: Axes, d: int, width: float, log_distance: bool) -> None:
    """Distance ticks whose labels never touch: every other step at a column's width; plain numbers on a log
    axis too (0, 1, 10, 100), the figure's one format."""
    if log_distance:
        log_distance_axis(ax)
        ax.xaxis.set_major_formatter(TrimmedFormatter(useOffset=False))
        ax.xaxis.set_minor_formatter(NullFormatter())
        if width < NARROW:  # 0, 10, 1000: a decade apart at most four labels fit a column's panel
            ax.xaxis.set_major_locator(FixedLocator([0, *(10.0**k for k in range(1, 7, 2))]))
        return
    step = tick_step_for(d) * (2 if width < NARROW else 1)
    ax.set_xticks(np.arange(0, d, step))


def dynamics_grid(sweep: Sweep, *, style: str | None = DEFAULT_STYLE, cmap: str = STEP_CMAP,
                  log_distance: bool = False, title: str | None = None) -> Figure:  # fmt: skip
    """Per head, b(d) at every checkpoint of ``sweep``, coloured by step: a legend of the steps when there are
    at most :data:`LEGEND_STEPS`, else a colorbar. ``log_distance``: a logarithmic distance axis; ``title``:
    what the figure shows (:func:`sweep_title`), above the legend."""
    steps = [step for step, _ in sweep]
    norm = Normalize(min(steps), max(steps) if max(steps) > min(steps) else min(steps) + 1)
    colours = step_colours(cmap)
    discrete = len(steps) <= LEGEND_STEPS
    if discrete:  # evenly spread over the map: neighbouring steps stay apart however uneven the steps are
        spread = {step: colours(k / max(len(steps) - 1, 1)) for k, step in enumerate(steps)}
    n_heads = len(sweep[0][1])
    with _context(style) as width:
        width = width or 6.0
        rows, cols = grid_shape(n_heads)
        lines = wrap_title(title, width, font_sizes(width)["base"]).count("\n") + 1 if title else 0
        fig = Figure(figsize=(width, rows * width / cols * 0.62 + 0.75 + 0.17 * lines), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True).ravel()
        for h, ax in enumerate(axes[:n_heads]):
            for step, heads in sweep:
                profile = heads[h].profile_mean
                colour = spread[step] if discrete else colours(norm(step))
                ax.plot(np.arange(profile.size), profile, color=colour, linewidth=0.8)
            d = sweep[0][1][h].profile_mean.size
            ax.set_xlim(0, max(d - 1, 1))
            _distance_ticks(ax, d, width, log_distance)
            _plain_ticks(ax, width)
            ax.tick_params(width=0.5, length=2.0, pad=1.5)
            ax.grid(True, linewidth=0.3, alpha=0.5)
            ax.set_title(f"Head {h + 1}")
        for ax in axes[n_heads:]:
            ax.set_visible(False)
        size = font_sizes(figure_width_in(fig))["base"]
        if discrete:
            handles = [Line2D([], [], color=spread[step], linewidth=1.2, label=f"{step:,}") for step in steps]
            fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False,
                       title="Training step", title_fontsize=size, handlelength=1.2, columnspacing=1.0)  # fmt: skip
        else:
            bar = fig.colorbar(ScalarMappable(norm=norm, cmap=colours), ax=axes.tolist(), shrink=0.6, aspect=30,
                               pad=0.01)  # fmt: skip
            bar.set_label("Training step", fontsize=size)
            bar.outline.set_linewidth(0.4)
        xlabel = "Distance $d = i - j$" + (" (log)" if log_distance else "")
        last = (rows - 1) * cols  # under the bottom row's middle panel: a supxlabel would sit under the legend
        axes[last + min(cols // 2, n_heads - 1 - last)].set_xlabel(xlabel, fontsize=size)
        fig.supylabel("Mean bias $b(d)$", fontsize=size)
        if title:
            fig.suptitle(wrap_title(title, width, size), fontsize=size)
    return fig


def over_training(sweep: Sweep, *, style: str | None = DEFAULT_STYLE, title: str | None = None) -> Figure:
    """Context dependence and Toeplitz residual of each head against the training step (symlog axes, the break
    from the linear 0 to the decades marked). Values below :data:`NOISE` are float32 rounding: drawn as 0,
    hollow, and said so, as in the diagnostics figure. ``title``: what the figure shows (scheme, layer, T, N)."""
    steps = np.array([step for step, _ in sweep], dtype=float)
    n_heads = len(sweep[0][1])
    metrics = [m for m in METRICS if m[0] in ("context_dependence", "toeplitz_residual")]
    with _context(style) as width:
        width = width or 6.0
        narrow = width < NARROW
        fig = Figure(figsize=(width, 0.6 * width + (1.4 if narrow else 0.5)), layout="constrained")
        axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (key, label) in zip(axes, metrics, strict=True):
            _metric_row(ax, sweep, steps, key, n_heads)
            ax.set_ylabel(SHORT[label] if narrow else label)
        axes[-1].set_xlabel("Training step")
        _step_ticks(axes[-1], steps, width)
        handles = axes[0].get_legend_handles_labels()[0]
        handles.append(Line2D([], [], color="0.35", marker="o", markerfacecolor="white", linestyle="none",
                              markersize=3.5, label=f"hollow: 0 (below {NOISE:.0e}, rounding)"))  # fmt: skip
        fig.legend(handles=handles, loc="outside lower center", ncol=min(n_heads, 4 if narrow else 6),
                   frameon=False, handlelength=1.2, columnspacing=1.0)  # fmt: skip
        heading = "; ".join(x for x in (title, "each relative to the head's spread over cells") if x)
        size = font_sizes(width)["base"]
        fig.suptitle(wrap_title(heading, width, size), fontsize=size)
    return fig


def _metric_row(ax: Axes, sweep: Sweep, steps: np.ndarray, key: str, n_heads: int) -> None:
    """One metric of every head against the step; rounding noise hollow at 0; 'not measured' where it was not."""
    top = LINTHRESH * 10
    measured = False
    for h in range(n_heads):
        values = [getattr(heads[h], key) for _, heads in sweep]
        y = np.array([np.nan if v is None else v for v in values], dtype=float)
        measured = measured or bool(np.isfinite(y).any())
        colour = _head_colour(h, n_heads)
        zero = np.abs(y) < NOISE  # float32 rounding is no structure: drawn as the 0 it stands for
        shown = np.where(zero, 0.0, y)
        ax.plot(steps, shown, linewidth=0.8, color=colour, label=f"Head {h + 1}", marker="o", markersize=2.5,
                markevery=list(np.flatnonzero(~zero)))  # fmt: skip
        ax.plot(steps[zero], shown[zero], linestyle="none", marker="o", markersize=2.5, markerfacecolor="white",
                markeredgecolor=colour, markeredgewidth=0.6)  # fmt: skip
        top = max(top, float(np.nanmax(y, initial=0.0)))
    ax.set_yscale("symlog", linthresh=LINTHRESH, linscale=0.6)
    ax.set_ylim(-LINTHRESH * 0.4, 10 ** np.ceil(np.log10(top) + 0.05))  # never < 0
    ax.yaxis.set_minor_formatter(NullFormatter())
    _break_mark(ax, 0.5 * LINTHRESH)  # the axis turns from linear (the 0) to logarithmic here
    ax.axhline(0.0, color="0.3", linewidth=0.5, zorder=0)
    ax.tick_params(width=0.5, length=2.0, pad=1.5)
    ax.grid(True, linewidth=0.3, alpha=0.5)
    if not measured:  # e.g. context dependence of one sample: nothing to draw, and the figure says why
        ax.text(0.5, 0.5, "not measured (needs 2 samples or more)", transform=ax.transAxes, ha="center",
                va="center", color="0.3")  # fmt: skip


def _step_ticks(ax: Axes, steps: np.ndarray, width: float) -> None:
    """Every checkpoint's step as a tick while the labels fit; else round steps (labels never touch)."""
    size = font_sizes(width)["tick"]
    label_in = (0.5 * len(f"{int(steps.max()):,}") + 1.0) * size / 72
    span = float(steps.max() - steps.min()) or 1.0
    gaps = np.diff(steps) / span * 0.85 * width
    if gaps.size == 0 or gaps.min() >= label_in:
        ax.set_xticks(steps)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=max(2, int(0.85 * width / label_in)), integer=True))
    formatter = TrimmedFormatter(useOffset=False)
    formatter.set_powerlimits((-3, 7))  # steps in plain digits, never as an offset or a power of ten
    ax.xaxis.set_major_formatter(formatter)


def _head_colour(h: int, n_heads: int) -> str | tuple[float, ...]:
    """The Okabe-Ito palette while it lasts, a sequential map beyond (12 heads need more than 8 colours)."""
    if n_heads <= len(PALETTE):
        return PALETTE[h]
    return colormaps["turbo"](0.05 + 0.9 * h / max(n_heads - 1, 1))


__all__ = ["LEGEND_STEPS", "dynamics_grid", "log_distance_axis", "over_training", "step_colours", "sweep_title"]
