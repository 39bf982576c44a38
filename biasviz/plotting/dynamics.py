"""Figures of a checkpoint sweep: how each head's bias, and its diagnostics, change over training.

``dynamics_grid``: one panel per head (the 4 x 3 grid of the heatmaps), the distance profile b(d) (mean
over samples and cells with i - j = d) at each checkpoint, coloured by training step, one colorbar.
``over_training``: context dependence and Toeplitz residual of each head against the training step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, ListedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from biasviz.diagnostics.measures import HeadDiagnostics
from biasviz.plotting.diagnostics_plots import LINTHRESH, PALETTE, _context
from biasviz.plotting.heatmap import figure_width_in, grid_shape, tick_step_for
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes

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


def dynamics_grid(sweep: Sweep, *, style: str | None = DEFAULT_STYLE, cmap: str = STEP_CMAP,
                  log_distance: bool = False) -> Figure:  # fmt: skip
    """Per head, b(d) at every checkpoint of ``sweep``, coloured by step: a legend of the steps when there are
    at most :data:`LEGEND_STEPS`, else a colorbar. ``log_distance``: a logarithmic distance axis."""
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
        fig = Figure(figsize=(width, rows * width / cols * 0.62 + 0.3), layout="constrained")
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True).ravel()
        for h, ax in enumerate(axes[:n_heads]):
            for step, heads in sweep:
                profile = heads[h].profile_mean
                colour = spread[step] if discrete else colours(norm(step))
                ax.plot(np.arange(profile.size), profile, color=colour, linewidth=0.8)
            d = sweep[0][1][h].profile_mean.size
            ax.set_xlim(0, max(d - 1, 1))
            if log_distance:
                log_distance_axis(ax)
            else:
                ax.set_xticks(np.arange(0, d, tick_step_for(d)))
            ax.tick_params(width=0.5, length=2.0, pad=1.5)
            ax.grid(True, linewidth=0.3, alpha=0.5)
            ax.set_title(f"Head {h + 1}")
        for ax in axes[n_heads:]:
            ax.set_visible(False)
        size = font_sizes(figure_width_in(fig))["base"]
        if discrete:
            handles = [Line2D([], [], color=spread[step], linewidth=1.2, label=f"{step:,}") for step in steps]
            fig.legend(handles=handles, loc="outside upper center", ncol=len(handles), frameon=False,
                       title="Training step", title_fontsize=size, handlelength=1.2, columnspacing=1.0)  # fmt: skip
        else:
            bar = fig.colorbar(ScalarMappable(norm=norm, cmap=colours), ax=axes.tolist(), shrink=0.6, aspect=30,
                               pad=0.01)  # fmt: skip
            bar.set_label("Training step", fontsize=size)
            bar.outline.set_linewidth(0.4)
        fig.supxlabel("Distance $i - j$" + (" (log)" if log_distance else ""), fontsize=size)
        fig.supylabel("Mean bias $b(d)$", fontsize=size)
    return fig


def over_training(sweep: Sweep, *, style: str | None = DEFAULT_STYLE) -> Figure:
    """Context dependence and Toeplitz residual of each head against the training step (symlog axes)."""
    steps = np.array([step for step, _ in sweep], dtype=float)
    n_heads = len(sweep[0][1])
    metrics = (("context_dependence", "Context dependence"), ("toeplitz_residual", "Toeplitz residual"))
    with _context(style) as width:
        width = width or 6.0
        fig = Figure(figsize=(width, 0.6 * width), layout="constrained")
        axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
        for ax, (key, label) in zip(axes, metrics, strict=True):
            top = LINTHRESH * 10
            for h in range(n_heads):
                values = [getattr(heads[h], key) for _, heads in sweep]
                y = np.array([np.nan if v is None else v for v in values], dtype=float)
                ax.plot(steps, y, marker="o", markersize=2.5, linewidth=0.8, color=_head_colour(h, n_heads),
                        label=f"Head {h + 1}")  # fmt: skip
                top = max(top, float(np.nanmax(y, initial=0.0)))
            ax.set_yscale("symlog", linthresh=LINTHRESH, linscale=0.6)
            ax.set_ylim(-LINTHRESH * 0.4, 10 ** np.ceil(np.log10(top) + 0.05))  # the metrics are never negative
            ax.axhline(0.0, color="0.3", linewidth=0.5, zorder=0)
            ax.set_ylabel(label)
            ax.tick_params(width=0.5, length=2.0, pad=1.5)
            ax.grid(True, linewidth=0.3, alpha=0.5)
        axes[-1].set_xlabel("Training step")
        axes[-1].set_xticks(steps)
        fig.legend(*axes[0].get_legend_handles_labels(), loc="outside upper center", ncol=min(n_heads, 6),
                   frameon=False, handlelength=1.2, columnspacing=1.0)  # fmt: skip
    return fig


def _head_colour(h: int, n_heads: int) -> str | tuple[float, ...]:
    """The Okabe-Ito palette while it lasts, a sequential map beyond (12 heads need more than 8 colours)."""
    if n_heads <= len(PALETTE):
        return PALETTE[h]
    return colormaps["turbo"](0.05 + 0.9 * h / max(n_heads - 1, 1))


__all__ = ["LEGEND_STEPS", "dynamics_grid", "log_distance_axis", "over_training", "step_colours"]
