"""Figures of docs/position-measures.md from a summary: how far each head looks (``bands``) and where in its context
(``context``, the U-curve), each with its 95 % band over samples (mean ± 1.96 SE) where the file holds an SE.

Bins of distance widen logarithmically past 16, so ``bands`` draws each bin's weight divided by its width (the mean
weight per distance inside the bin: bins of one and of two distances side by side would otherwise zigzag) at the
bin's middle distance, on a log-log scale (distance + 1, so that 0 has a place). ``context`` draws the weight on
each tenth of the keys a query sees, earliest first, against the 0.1 a uniform head would give.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullFormatter

from biasviz.common.errors import BiasvizError
from biasviz.plotting.diagnostics_plots import PALETTE
from biasviz.plotting.heatmap import figure_width_in, grid_shape
from biasviz.plotting.style import DEFAULT_STYLE, font_sizes, paper_context, wrap_title
from biasviz.plotting.titles import file_title
from biasviz.store import BiasFile
from biasviz.store.datasets import (
    ATTENDED,
    BAND_MASS,
    CONTEXT_MASS,
    FREQUENCY_USE,
    KEY_PROFILE,
    SEGMENTS,
    WEIGHTS_ENTROPY,
    se_name,
)
from biasviz.store.format import block_starts

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def need_measure(bf: BiasFile, layer: int, name: str, what: str) -> int:
    """The resolved layer, or one error saying why the file holds no ``name`` for it."""
    resolved = bf.resolve_layer(layer)
    if bf.summary is None:
        raise BiasvizError(f"{what} is measured by 'biasviz extract --summary' (docs/position-measures.md); {bf.path} "
                           "is a full file: extract a summary of the same windows")  # fmt: skip
    if bf.bias_only:
        raise BiasvizError(f"{what} needs a forward pass over text; {bf.path} was made with --bias-only")
    if not bf.summary.holds(resolved, name):
        note = bf.summary.note(resolved)
        if note:  # the summary says why (samples masked differently)
            raise BiasvizError(f"{bf.path} holds no {name} for layer {resolved}: {note}")
        raise BiasvizError(f"{bf.path} holds no {name} for layer {resolved}: it was made before biasviz measured it, "
                           "or by a model whose attention weights biasviz does not see as they are formed; extract "
                           "it again")  # fmt: skip
    return resolved


def _with_se(bf: BiasFile, name: str, layer: int) -> tuple[np.ndarray, np.ndarray | None]:
    mean = bf.summary_array(name, layer)[0]
    se = bf.summary_array(se_name(name), layer) if bf.summary.holds(layer, se_name(name)) else None
    return mean, se


# each figure kind's profile -> the standard error drawn as its band
_SE_OF = {"bands": se_name(BAND_MASS), "context": se_name(CONTEXT_MASS), "frequency": se_name(FREQUENCY_USE),
          "entropy": se_name(WEIGHTS_ENTROPY), "sinks": se_name(KEY_PROFILE)}  # fmt: skip


def se_note(bf: BiasFile, layer: int, kind: str) -> str:
    """What a figure of ``kind`` says of its band: the 95 % interval it shades, or why it has none."""
    held = bf.summary is not None and bf.summary.holds(bf.resolve_layer(layer), _SE_OF[kind])
    return _band_note(bf, np.zeros(0) if held else None)


def _band_note(bf: BiasFile, se: np.ndarray | None) -> str:
    if se is None:
        return f"no 95% band: a standard error needs 3 samples or more (the file holds {bf.n_samples})"
    return "shaded: 95% interval of the mean over samples (±1.96\u00a0SE)"


def bands_figure(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE) -> Figure:
    """Per head: the weight a query puts on each distance bin, mean over queries and samples, with its 95 % band."""
    resolved = need_measure(bf, layer, BAND_MASS, "the weight by distance (band mass)")
    mean, se = _with_se(bf, BAND_MASS, resolved)
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
    resolved = need_measure(bf, layer, CONTEXT_MASS, "the weight by place in the context (context mass)")
    mean, se = _with_se(bf, CONTEXT_MASS, resolved)
    x = (np.arange(SEGMENTS) + 0.5) / SEGMENTS
    title = file_title(bf, f"{scheme} attention weight by place in the context", resolved,
                       details=[f"queries that see {SEGMENTS} keys or more; dotted: uniform ({1 / SEGMENTS:g})",
                                _band_note(bf, se)])  # fmt: skip
    return _per_head(x, mean, se, title, ylabel="Weight on the tenth",
                     xlabel="Place among the keys a query sees (0 earliest, 1 latest)", log_x=False,
                     reference=1 / SEGMENTS, style=style)  # fmt: skip


def frequency_figure(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE) -> Figure:
    """Per head: the mean 2-norm of each rotary pair of q and of k against the pair's index f (0 turns fastest), with
    95 % bands, as Barbero et al.'s (ICLR 2025) frequency-usage figure; a partial rotary model's unrotated dims (one
    norm for all of them) drawn apart, right of a dotted line, with 95 % error bars."""
    resolved = bf.resolve_layer(layer)
    if bf.summary is not None and not bf.bias_only and not bf.summary.holds(resolved, FREQUENCY_USE) \
            and bf.summary.holds(resolved, BAND_MASS):  # fmt: skip
        raise BiasvizError(f"{bf.path} holds no {FREQUENCY_USE} for layer {resolved}: rotary frequencies are measured "
                           f"where the attention call rotates q and k (RoPE), and biasviz found no rotary module in "
                           f"the {bf.scheme} model (ALiBi and other additive schemes rotate nothing)")  # fmt: skip
    resolved = need_measure(bf, layer, FREQUENCY_USE, f"the rotary frequencies' use ({FREQUENCY_USE})")
    use = bf.summary_array(FREQUENCY_USE, resolved)
    held = bf.summary.holds(resolved, se_name(FREQUENCY_USE))
    se = bf.summary_array(se_name(FREQUENCY_USE), resolved) if held else None
    said = bf.summary.rotary_pairs(resolved)
    pairs = use.shape[-1] if said is None else said[0]
    details = ["q: solid, blue; k: dashed, orange", f"{pairs} rotary pairs" + ("" if said is None else f", {said[1]}"),
               _band_note(bf, se)]
    if pairs < use.shape[-1]:
        details.insert(2, "right of the dotted line: the unrotated dims, one norm for all of them")
    elif said is None:
        details.insert(2, "the file does not say whether its last row is the unrotated dims")
    title = file_title(bf, f"{scheme} rotary frequency use", resolved, details=details)
    series = [Series(use[o, :, :pairs], None if se is None else se[o, :, :pairs], PALETTE[c], dashes)
              for o, (c, dashes) in enumerate(((0, "-"), (5, "--")))]  # fmt: skip

    def unrotated(ax: Axes, h: int, size: float) -> None:
        ticks = [t for t in MaxNLocator(nbins=4, integer=True).tick_values(0, pairs - 1) if 0 <= t <= pairs - 1]
        if pairs == use.shape[-1]:
            ax.set_xticks(ticks)
            return
        ax.axvline(pairs, color="0.5", lw=0.6, ls=":")
        for o, c in enumerate((0, 5)):  # q and k side by side
            err = None if se is None else Z95 * se[o, h, pairs]
            ax.errorbar([pairs + 0.85 + 0.3 * o], [use[o, h, pairs]], yerr=err, fmt="s", ms=2.4, color=PALETTE[c],
                        elinewidth=0.7, capsize=1.2, gid=f"unrotated {'qk'[o]}")  # fmt: skip
        ax.set_xticks([*ticks, pairs + 1], [f"{t:g}" for t in ticks] + ["unrot."])

    return _per_head(np.arange(pairs, dtype=np.float64), series, None, title,
                     ylabel="Mean 2-norm of the pair", log_x=False, reference=None, style=style, after=unrotated,
                     xlabel="Rotary pair $f$ (0: fastest frequency, $\\theta_f$ = base$^{-2f/d_{rot}}$)")  # fmt: skip


def entropy_figure(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE) -> Figure:
    """Per head: the entropy (nats) of a query's weights, averaged over each block of queries and over samples,
    with its 95 % band, against the query's position; dotted, a head that spreads its weight evenly over the keys
    it sees (ln of their count: the most a query can have), where the file's mask says what that count is."""
    resolved = need_measure(bf, layer, WEIGHTS_ENTROPY, f"the entropy of the weights ({WEIGHTS_ENTROPY})")
    mean, se = _with_se(bf, WEIGHTS_ENTROPY, resolved)
    starts = block_starts(bf.seq_len, bf.block)
    ends = np.minimum(starts + bf.block, bf.seq_len)
    x = (starts + ends - 1) / 2
    uniform = None
    if bf.attrs.get("mask") in ("causal", "bidirectional") and not bf.summary.holds(resolved, ATTENDED):
        seen = [np.log(np.arange(a, b) + 1.0) if bf.causal else np.full(b - a, np.log(bf.seq_len))
                for a, b in zip(starts, ends, strict=True)]  # fmt: skip
        uniform = np.array([v.mean() for v in seen])
    block = "each query" if bf.block == 1 else f"blocks of {bf.block} queries"
    details = [f"{block}; dotted: even weight on every key seen, ln({'i + 1' if bf.causal else 'T'})"
               if uniform is not None else block, _band_note(bf, se)]  # fmt: skip
    title = file_title(bf, f"{scheme} entropy of the attention weights", resolved, details=details)

    def reference(ax: Axes, h: int, size: float) -> None:
        if uniform is not None:
            ax.plot(x, uniform, ":", color="0.5", lw=0.7)

    return _per_head(x, mean, se, title, ylabel="Entropy of a query's weights (nats)", xlabel="Query position $i$",
                     log_x=False, reference=None, style=style, after=reference)  # fmt: skip


@dataclass(frozen=True)
class Series:
    """One line per panel: ``mean`` (H, points) against the figure's x, its 95 % band where ``se`` is given."""

    mean: np.ndarray
    se: np.ndarray | None
    colour: str = PALETTE[0]
    dashes: str = "-"


def _per_head(x: np.ndarray, mean: np.ndarray | Sequence[Series], se: np.ndarray | None, title: str, *, ylabel: str,
              xlabel: str, log_x: bool, reference: float | None, style: str | None = DEFAULT_STYLE,
              after: Callable[[Axes, int, float], None] | None = None) -> Figure:  # fmt: skip
    """A panel per head: each series' mean against ``x``, its 95 % band where it has an SE, every panel on one y
    scale (heads are compared by height); ``after(ax, head, size)`` draws what else a panel holds."""
    series = [Series(mean, se)] if isinstance(mean, np.ndarray) else list(mean)
    heads = series[0].mean.shape[0]
    with head_panels(heads, title, style, sharey=True) as (fig, axes, size, _):
        marker = {"marker": "o", "ms": 1.6} if len(x) <= 48 else {}
        for h, ax in enumerate(axes[:heads]):
            for s in series:
                if s.se is not None:
                    ax.fill_between(x, s.mean[h] - Z95 * s.se[h], s.mean[h] + Z95 * s.se[h], color=s.colour,
                                    alpha=0.25, lw=0)  # fmt: skip
                ax.plot(x, s.mean[h], s.dashes, color=s.colour, lw=0.9, **marker)
            if reference is not None:
                ax.axhline(reference, color="0.5", lw=0.6, ls=":")
            if after is not None:
                after(ax, h, size)
            if log_x:  # weights per distance span decades: both axes logarithmic
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.yaxis.set_minor_formatter(NullFormatter())  # decades labelled, one format per axis
        if not log_x:  # from 0 to the top of every head's line and band, set once for the shared scale (set per
            # panel, the first head's top froze it and cut off the higher heads' lines)
            tops = [np.nanmax(s.mean + (0 if s.se is None else Z95 * np.nan_to_num(s.se))) for s in series]
            top = max([t for t in tops if np.isfinite(t)] + [reference or 0.0])
            axes[0].set_ylim(0, top * 1.05 if top > 0 else 1.0)
        fig.supxlabel(xlabel, fontsize=size)
        fig.supylabel(ylabel, fontsize=size)
    return fig


@contextlib.contextmanager
def head_panels(heads: int, title: str, style: str | None, *, sharey: bool = False) -> Iterator[tuple]:
    """A figure of one panel per head in the paper style, titled 'Head h' (the panels past the heads hidden, the
    title wrapped to the width once the caller has drawn): yields (figure, axes, base font size, columns)."""
    with paper_context(style) if style else contextlib.nullcontext() as width:
        rows, cols = grid_shape(heads)
        width = width or 6.0
        size = font_sizes(width)["base"]
        wrapped = wrap_title(title, width, size)
        fig = Figure(figsize=(width, rows * width / cols * 0.62 + 0.45 + 0.17 * wrapped.count("\n")),
                     layout="constrained")  # fmt: skip
        axes = fig.subplots(rows, cols, squeeze=False, sharex=True, sharey=sharey).ravel()
        for h, ax in enumerate(axes[:heads]):
            ax.set_title(f"Head {h + 1}", fontsize=size)
            ax.tick_params(labelsize=size * 0.85)
        for ax in axes[heads:]:
            ax.set_visible(False)
        yield fig, axes, size, cols
        fig.suptitle(wrapped, fontsize=size)
        assert figure_width_in(fig) > 0

