"""Figures of SPEC section 14 from a summary: how far each head looks (``bands``) and where in its context
(``context``, the U-curve), each with its 95 % band over samples (mean ± 1.96 SE) where the file holds an SE.

Bins of distance widen logarithmically past 16, so ``bands`` draws each bin's weight divided by its width (the mean
weight per distance inside the bin: bins of one and of two distances side by side would otherwise zigzag) at the
bin's middle distance, on a log-log scale (distance + 1, so that 0 has a place). ``context`` draws the weight on
each tenth of the keys a query sees, earliest first, against the 0.1 a uniform head would give.
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter

from biasviz.common.errors import BiasvizError
from biasviz.plotting.diagnostics_plots import PALETTE
from biasviz.plotting.heatmap import figure_width_in, grid_shape
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, paper_context, wrap_title
from biasviz.plotting.titles import file_title
from biasviz.store import BiasFile
from biasviz.store.datasets import SEGMENTS

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def need_measure(bf: BiasFile, layer: int, name: str, what: str) -> int:
    """The resolved layer, or one error saying why the file holds no ``name`` for it."""
    resolved = bf.resolve_layer(layer)
    if bf.summary is None:
        raise BiasvizError(f"{what} is measured by 'biasviz extract --summary' (SPEC section 14); {bf.path} is a full "
                           "file: extract a summary of the same windows")  # fmt: skip
    if bf.bias_only:
        raise BiasvizError(f"{what} needs a forward pass over text; {bf.path} was made with --bias-only")
    if not bf.summary.holds(resolved, name):
        raise BiasvizError(f"{bf.path} holds no {name} for layer {resolved}: it was made before biasviz measured it, "
                           "or by a model whose attention weights biasviz does not see as they are formed; extract "
                           "it again")  # fmt: skip
    return resolved


def _with_se(bf: BiasFile, name: str, layer: int) -> tuple[np.ndarray, np.ndarray | None]:
    mean = bf.summary_array(name, layer)[0]
    se = bf.summary_array(f"{name}_se", layer) if bf.summary.holds(layer, f"{name}_se") else None
    return mean, se


def _band_note(bf: BiasFile, se: np.ndarray | None) -> str:
    if se is None:
        return f"no 95 % band: a standard error needs 3 samples or more (the file holds {bf.n_samples})"
    return "shaded: 95 % interval of the mean over samples (± 1.96 SE)"


def bands_figure(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE) -> Figure:
    """Per head: the weight a query puts on each distance bin, mean over queries and samples, with its 95 % band."""
    resolved = need_measure(bf, layer, "band_mass", "the weight by distance (band mass)")
    mean, se = _with_se(bf, "band_mass", resolved)
    bins = bf.summary.distance_bins()
    width = (bins[:, 1] - bins[:, 0] + 1).astype(np.float64)
    x = bins.mean(axis=1) + 1  # each bin's middle distance, + 1 so that distance 0 has a place on a log axis
    title = file_title(bf, f"{scheme} attention weight by distance", resolved,
                       details=["per distance: each bin's weight over its width", _band_note(bf, se)])  # fmt: skip
    return _per_head(x, mean / width, None if se is None else se / width, title,
                     ylabel="Weight per distance (mean over queries)", xlabel="Distance $i - j$ + 1",
                     log_x=True, reference=None, style=style)  # fmt: skip


def context_figure(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE) -> Figure:
    """Per head: the weight on each tenth of the keys a query sees (earliest first), with its 95 % band: the
    U-shape of Liu et al. 2024 and Hsieh et al. 2024 where a head favours both ends."""
    resolved = need_measure(bf, layer, "context_mass", "the weight by place in the context (context mass)")
    mean, se = _with_se(bf, "context_mass", resolved)
    x = (np.arange(SEGMENTS) + 0.5) / SEGMENTS
    title = file_title(bf, f"{scheme} attention weight by place in the context", resolved,
                       details=[f"queries that see {SEGMENTS} keys or more; dotted: uniform ({1 / SEGMENTS:g})",
                                _band_note(bf, se)])  # fmt: skip
    return _per_head(x, mean, se, title, ylabel="Weight on the tenth",
                     xlabel="Place among the keys a query sees (0 earliest, 1 latest)", log_x=False,
                     reference=1 / SEGMENTS, style=style)  # fmt: skip


def _per_head(x: np.ndarray, mean: np.ndarray, se: np.ndarray | None, title: str, *, ylabel: str, xlabel: str,
              log_x: bool, reference: float | None, style: str | None = DEFAULT_STYLE) -> Figure:  # fmt: skip
    """A panel per head: ``mean`` (H, points) against ``x``, its 95 % band where ``se`` is given, every panel on
    one y scale (heads are compared by height)."""
    heads = mean.shape[0]
    with paper_context(style) if style else nullcontext() as width:
        rows, cols = grid_shape(heads)
        width = width or 6.0
        size = font_sizes(width)["base"]
        wrapped = wrap_title(title, width, size)
        fig = Figure(figsize=(width, rows * width / cols * 0.62 + 0.45 + 0.17 * wrapped.count("\n")),
                     layout="constrained")  # fmt: skip
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
        colour = PALETTE[0]
        for h, ax in enumerate(axes[:heads]):
            if se is not None:
                ax.fill_between(x, mean[h] - Z95 * se[h], mean[h] + Z95 * se[h], color=colour, alpha=0.25, lw=0)
            ax.plot(x, mean[h], "-", color=colour, lw=0.9, marker="o", ms=1.6)
            if reference is not None:
                ax.axhline(reference, color="0.5", lw=0.6, ls=":")
            if log_x:  # weights per distance span decades: both axes logarithmic
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())  # decades labelled, one format per axis
            else:
                ax.set_ylim(bottom=0)
            ax.set_title(f"Head {h + 1}", fontsize=size)
            ax.tick_params(labelsize=size * 0.85)
        for ax in axes[heads:]:
            ax.set_visible(False)
        fig.supxlabel(xlabel, fontsize=size)
        fig.supylabel(ylabel, fontsize=size)
        fig.suptitle(wrapped, fontsize=size)
        assert figure_width_in(fig) > 0
    return fig


# plot kind -> (draw function, what its figure shows: for the saved file's metadata)
MEASURE_FIGURES = {
    "bands": (bands_figure, "weight a query puts on each distance bin, with a 95 % band over samples"),
    "context": (context_figure, "weight on each tenth of the keys a query sees, with a 95 % band over samples"),
}
