"""Figures of docs/positional.md from a summary: the positional logits P, their distance profile, and the sinks.

P(i, j) is the score a query at i of one text gives a key at j of another, averaged over pairs of texts, plus
the mean additive part: what position alone gives, for RoPE and NoPE as for ALiBi. The softmax ignores a
constant per query row, and each head's P has its own offset, so the grid draws each head's P relative to its
own value at distance 0 (a diverging map, white where P equals P(d = 0)), and says so.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from biasviz.common.errors import BiasvizError
from biasviz.diagnostics.stored import SINK_EPSILON
from biasviz.plotting.diagnostics_plots import PALETTE
from biasviz.plotting.heatmap import head_grid
from biasviz.plotting.load import HeadMatrices, load_summary_heads
from biasviz.plotting.measures_plots import Z95, head_panels, se_note
from biasviz.plotting.profiles import blocks_note
from biasviz.plotting.scales import ValueRange
from biasviz.plotting.style import DEFAULT_STYLE
from biasviz.plotting.titles import file_title
from biasviz.store import BiasFile
from biasviz.store.datasets import (
    KEY_PROFILE,
    POSITIONAL_MEAN,
    POSITIONAL_PROFILE,
    SINK_SHARE,
    profile_name,
    se_name,
)


def need_position(bf: BiasFile, layer: int, what: str, positional: bool = True) -> int:
    """The resolved layer, or one error saying why the file holds no docs/positional.md data of it."""
    resolved = bf.resolve_layer(layer)
    if bf.summary is None:
        raise BiasvizError(f"{what} are computed by 'biasviz extract --summary' (from the sums of q and k over "
                           f"samples); {bf.path} is a full file: extract a summary of the same windows")  # fmt: skip
    if bf.bias_only:
        raise BiasvizError(f"{what} need a forward pass over text; {bf.path} was made with --bias-only")
    name = POSITIONAL_MEAN if positional else KEY_PROFILE
    if not bf.summary.holds(resolved, name):
        if positional and bf.n_samples < 2:
            raise BiasvizError(f"positional logits need two samples or more (P pairs a query of one text with keys "
                               f"of another); {bf.path} holds {bf.n_samples}: extract with --samples 2 or more")
        note = bf.summary.note(resolved)
        if note:  # the summary says why (samples masked differently)
            raise BiasvizError(f"{bf.path} holds no {what} for layer {resolved}: {note}")
        raise BiasvizError(f"{bf.path} holds no {what} for layer {resolved}: it was made before biasviz stored "
                           "them, or by a model whose attention biasviz cannot form again; extract it again")
    return resolved


def positional_heads(bf: BiasFile, layer: int, *, reduce: str = "mean", max_cells: int = 512) -> HeadMatrices:
    """Each head's P map minus its own value at distance 0 (the diagonal's mean), ready for :func:`head_grid`."""
    resolved = need_position(bf, layer, "positional logits")
    heads = load_summary_heads(bf, POSITIONAL_MEAN, layer=resolved, reduce=reduce, max_cells=max_cells)
    at_zero = bf.summary_array(POSITIONAL_PROFILE, resolved)[0, :, 0]  # (H,) P at d = 0, over all keys
    heads.data = heads.data - at_zero[:, None, None]
    full = bf.summary_map(POSITIONAL_MEAN, resolved) - at_zero[:, None, None]  # what the scales span
    heads.ranges = [ValueRange.of(m, percentile=False) for m in full]
    return heads


def positional_grid(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE,
                    shared_scale: bool = False, cmap: str | None = None, max_cells: int = 512) -> Figure:  # fmt: skip
    heads = positional_heads(bf, layer, max_cells=max_cells)
    title = file_title(bf, f"{scheme} positional logits P(i, j) − P(d = 0)", heads.layer,
                       details=[blocks_note(bf)])  # fmt: skip
    return head_grid(heads, kind="positional", shared_scale=shared_scale, cmap=cmap, style=style, causal=True,
                     suptitle=title)  # fmt: skip


def positional_profile_figure(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE,
                              log_distance: bool = False) -> Figure:  # fmt: skip
    """Per head: P(d) over all keys and over keys j >= 4, and b(d) where the model adds a bias, in logits."""
    resolved = need_position(bf, layer, "positional logits")
    p = bf.summary_array(POSITIONAL_PROFILE, resolved)  # (2, H, T)
    bias = bf.profile("bias", resolved)[0] if bf.summary.holds(resolved, profile_name("bias")) else None
    lines = [("P(d), all keys", p[0], "-"), ("P(d), keys j ≥ 4", p[1], "--")]
    if bias is not None:
        lines.append(("b(d), the additive part", bias, ":"))
    title = file_title(bf, f"{scheme} positional logits by distance", resolved)
    return _per_head(lines, title, "Logit", "Distance $i - j$", style, log_distance)


def sinks_figure(bf: BiasFile, layer: int, *, scheme: str, style: str | None = DEFAULT_STYLE,
                 keys: int = 16) -> Figure:  # fmt: skip
    """Per head: the weights' key profile over the first ``keys`` keys; key 0's share is the sink share."""
    resolved = need_position(bf, layer, "the weights' key profile", positional=False)
    mean = bf.summary_array(KEY_PROFILE, resolved)[0][:, :keys]  # (H, keys)
    share = bf.summary_array(SINK_SHARE, resolved)  # (N, H)
    se = (bf.summary_array(se_name(KEY_PROFILE), resolved)[:, :keys]
          if bf.summary.holds(resolved, se_name(KEY_PROFILE)) else None)  # fmt: skip
    sink_mean = int((mean[:, 0] > SINK_EPSILON).sum())
    per_sample = float((share > SINK_EPSILON).mean())
    title = file_title(bf, f"{scheme} weight on the first keys", resolved,
                       which=f"mean over {bf.n_samples} samples and the queries that see each key",
                       details=[f"sink heads (key 0 > {SINK_EPSILON}): {sink_mean} of {mean.shape[0]} from the mean, "
                                f"{100 * per_sample:.0f}% of (sample, head) pairs", se_note(bf, resolved, "sinks")])
    return _per_head([("mean weight", mean, "-")], title, "Weight", "Key position $j$", style, False,
                     threshold=SINK_EPSILON, markers=True, band=se)  # fmt: skip


def _per_head(lines: list[tuple[str, np.ndarray, str]], title: str, ylabel: str, xlabel: str, style: str | None,
              log_distance: bool, threshold: float | None = None, markers: bool = False,
              band: np.ndarray | None = None) -> Figure:  # fmt: skip
    """A panel per head of ``lines``; ``band``: the first line's standard error, shaded as its 95 % interval."""
    heads = lines[0][1].shape[0]
    with head_panels(heads, title, style) as (fig, axes, size, cols):
        for h, ax in enumerate(axes[:heads]):
            for k, (label, values, ls) in enumerate(lines):
                x = np.arange(values.shape[-1])
                y = values[h]
                if log_distance:
                    x, y = x[1:], y[1:]
                if band is not None and k == 0:
                    half = Z95 * band[h][-len(y) :]
                    ax.fill_between(x, y - half, y + half, color=PALETTE[0], alpha=0.25, lw=0)
                ax.plot(x, y, ls, color=PALETTE[k % len(PALETTE)], lw=0.9, label=label,
                        marker="o" if markers else None, ms=2)  # fmt: skip
            if threshold is not None:
                ax.axhline(threshold, color="0.5", lw=0.6, ls="--")
            if log_distance:
                ax.set_xscale("log")
        if len(lines) > 1:
            fig.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=len(lines),
                       fontsize=size * 0.9, frameon=False)  # fmt: skip
        for ax in _bottom_row(axes[:heads], cols):  # each column's lowest panel: the legend below keeps clear
            ax.set_xlabel(xlabel, fontsize=size)
        fig.supylabel(ylabel, fontsize=size)
    return fig


def _bottom_row(axes: np.ndarray, cols: int) -> list:
    """The lowest drawn panel of each column: where the distance axis is labelled (a supxlabel would sit under an
    outside legend, which constrained layout does not place around it)."""
    return [axes[c::cols][-1] for c in range(min(cols, len(axes)))]

