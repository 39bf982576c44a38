"""Per-head heatmaps of (query, key) matrices, laid out like Figures 10-14 of the CABLE paper.

``head_heatmap`` draws one matrix into an Axes; ``head_grid`` draws one panel per head (3 columns,
``Head 1`` ... ``Head H``), each with its own colorbar unless one shared scale is asked for. Both
return what they drew into, so users can compose their own figures. Query rows run top to bottom and
key columns left to right; NaN cells (the causal mask) take a neutral colour of their own. A PDF or SVG keeps
vector text and axes around each panel's bitmap, embedded at its own resolution: one image pixel per drawn cell.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib as mpl
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure, SubFigure
from matplotlib.font_manager import FontProperties
from matplotlib.ticker import ScalarFormatter

from biasviz.plotting.load import HeadMatrices
from biasviz.plotting.reduce import DEFAULT_MAX_CELLS, Reduction, block_reduce, plan_reduction
from biasviz.plotting.scales import (
    DEFAULT_CMAPS,
    KINDS,
    ValueRange,
    _colormap,
    _extend,
    colour_scale,
    format_colorbars,
    head_scales,
)
from biasviz.plotting.style import font_sizes, paper_context, wrap_title
from biasviz.store import causal_cells
from biasviz.store.datasets import map_name

N_COLS = 3
#: Cells are drawn as they are, never filtered: a filter mixes neighbouring cells into colours that are not on
#: the colorbar (T5's bucket stripes blur). 'none' (not 'nearest', and the image not rasterized): a PDF or SVG
#: embeds the matrix itself, one image pixel per cell, whatever dpi it is saved at (a 512-cell panel saved at
#: 100 dpi kept 134 of them); a PNG samples the nearest cell, so matrices larger than its panel's pixels are
#: block-reduced first (every cell counted in its block's mean).
INTERPOLATION = "none"
_NICE_STEPS = (1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 2500, 5000, 10000, 20000, 50000)


# -- public API -------------------------------------------------------------------------------------


def head_heatmap(
    matrix: np.ndarray,
    *,
    ax: Axes | None = None,
    kind: str = "bias",
    norm: Normalize | None = None,
    cmap: str | Colormap | None = None,
    log: bool = False,
    title: str | None = None,
    colorbar: bool = True,
    seq_len: int | None = None,
    tick_step: int | None = None,
    causal: bool = True,
) -> Axes:
    """Draw one (query, key) matrix into ``ax`` (a new figure if None) and return the Axes.

    ``seq_len`` is the number of positions the matrix spans when it was already block-reduced
    (default: its own size), so ticks stay in positions. ``causal`` blanks cells with key > query.
    """
    if ax is None:
        ax = Figure(figsize=(3.0, 2.6), layout="constrained").add_subplot()
    m = _as_matrix(matrix, causal)
    values = ValueRange.of(m, ValueRange.needs_percentile(kind) and norm is None)  # one pass: scale and arrows
    norm_, cmap_ = (norm, _colormap(cmap)) if norm is not None else colour_scale(values, kind, log=log, cmap=cmap)
    painter = _HeatmapPainter(ax, m, seq_len or m.shape[-1], tick_step, values=values)
    painter.paint(norm_, cmap_, title, colorbar)
    if painter.colorbar is not None:
        format_colorbars([painter.colorbar])
    return ax


def head_grid(
    data: np.ndarray | HeadMatrices,
    *,
    fig: Figure | SubFigure | None = None,
    kind: str = "bias",
    titles: Sequence[str] | None = None,
    shared_scale: bool = False,
    cmap: str | Colormap | None = None,
    log: bool = False,
    style: str | None = None,
    seq_len: int | None = None,
    reduce: str = "mean",
    max_cells: int = DEFAULT_MAX_CELLS,
    tick_step: int | None = None,
    causal: bool = True,
    suptitle: str | None = None,
) -> Figure | SubFigure:
    """Draw (head, query, key) matrices as a grid of panels, 3 per row, and return the figure.

    ``data`` is what :func:`biasviz.plotting.load.load_heads` prepared (drawn as it is), or a plain
    array, which is masked (``causal``) and, beyond ``max_cells`` per axis, block-reduced (``reduce``:
    'mean' or 'max') first; the reduction is recorded in ``fig.biasviz_reduction``. A paper ``style``
    (``neurips``, ``icml``, ...) sizes the figure and its text only when asked, inside a matplotlib
    rc context: the caller's settings are never changed. ``suptitle``: one line above the panels (what the
    grid shows, e.g. the mean over how many samples); ``kind`` may also be 'bias_std' or 'weights_std'.
    """
    if isinstance(data, HeadMatrices):  # prepared once by load_heads: masked, normalised, reduced
        return _GridPainter(data.data, kind=kind, titles=titles, shared_scale=shared_scale, cmap=cmap, log=log,
                            style=style, seq_len=data.seq_len, reduce=data.reduction.how, max_cells=max_cells,
                            tick_step=tick_step, causal=causal, prepared=data.reduction, block=data.block,
                            suptitle=suptitle, ranges=data.ranges).paint(fig)  # fmt: skip
    return _GridPainter(data, kind=kind, titles=titles, shared_scale=shared_scale, cmap=cmap, log=log,
                        style=style, seq_len=seq_len, reduce=reduce, max_cells=max_cells,
                        tick_step=tick_step, causal=causal, suptitle=suptitle).paint(fig)  # fmt: skip


def grid_shape(n_heads: int) -> tuple[int, int]:
    """Rows and columns for ``n_heads`` panels: 3 columns, as in the paper (12 heads: 4 x 3)."""
    cols = min(N_COLS, max(n_heads, 1))
    return math.ceil(n_heads / cols), cols


def figure_width_in(fig: Figure | SubFigure) -> float:
    """Width in inches of a figure or of a subfigure inside one."""
    return float(fig.bbox.width / fig.dpi)


def panel_cells(style: str | None, dpi: float, n_heads: int) -> int:
    """How many cells a panel can show at one pixel or more each, in the PNG (``dpi``) and in the raster inside
    the vector formats: matrices are block-reduced to this first, so nearest sampling drops no cell."""
    from biasviz.plotting.save import VECTOR_RASTER_DPI
    from biasviz.plotting.style import venue_width

    cols = grid_shape(n_heads)[1]
    width = venue_width(style) if style else 6.0
    panel_in = width / cols * (0.56 if cols == N_COLS else 0.7)  # as paint() lays the panels out
    return max(16, int(panel_in * min(dpi, VECTOR_RASTER_DPI)))


def tick_step_for(seq_len: int) -> int:
    """Tick spacing in positions: every 100 (as in the paper) up to ~600 positions, coarser beyond.

    >>> [tick_step_for(t) for t in (32, 64, 256, 512, 1024, 4096)]
    [10, 20, 100, 100, 200, 1000]
    """
    floor = 100 if seq_len >= 200 else 1
    for step in _NICE_STEPS:
        if step >= floor and (seq_len - 1) // step + 1 <= 6:
            return step
    return _NICE_STEPS[-1]


def _as_matrix(matrix: np.ndarray, causal: bool) -> np.ndarray:
    m = np.array(matrix, dtype=np.float32, copy=True)
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ValueError(f"expected a square (query, key) matrix, got shape {m.shape}")
    if causal:
        m[~causal_cells(m.shape[0])] = np.nan
    return m


#: What a colorbar shows, by kind (plain text: mathtext labels cost time in every grid).
COLORBAR_LABELS = {"bias": "bias b(i, j)", "weights": "attention weight",
                   map_name("bias", "std"): "bias: std over samples",
                   map_name("weights", "std"): "weight: std over samples", "positional": "P(i, j) − P(0)",
                   "scores": "score s(i, j)", map_name("scores", "std"): "score: std over samples"}  # fmt: skip


def colorbar_label(kind: str, log: bool = False) -> str:
    """The label of a colorbar of ``kind``: its quantity, and the scale where it is not linear.

    >>> colorbar_label("weights", log=True)
    'attention weight, log scale'
    """
    label = COLORBAR_LABELS.get(kind, kind)
    return f"{label}, log scale" if log else label


def _label_colorbar(cb: mpl.colorbar.Colorbar, label: str) -> None:
    if label:
        size = FontProperties(size=mpl.rcParams["ytick.labelsize"]).get_size_in_points()
        cb.set_label(label, fontsize=size, labelpad=1.5)


# -- drawing ----------------------------------------------------------------------------------------


class _HeatmapPainter:
    """Draws one matrix with its ticks in positions and an optional colorbar."""

    def __init__(self, ax: Axes, matrix: np.ndarray, seq_len: int, tick_step: int | None,
                 panel_in: float | None = None, cell: int | None = None,
                 values: ValueRange | None = None) -> None:  # fmt: skip
        self.ax, self.m, self.seq_len, self.panel_in, self.cell = ax, matrix, seq_len, panel_in, cell
        # the data behind the drawn cells (their extremes: where the colorbar gets arrows)
        self.values = values if values is not None else ValueRange.of(matrix, percentile=False)
        self.step = tick_step or tick_step_for(seq_len)
        self.colorbar: mpl.colorbar.Colorbar | None = None  # labelled by format_colorbars, once per figure

    def paint(self, norm: Normalize, cmap: Colormap, title: str | None, colorbar: bool, label: str = "") -> None:
        ax, n = self.ax, self.m.shape[0]
        # positions covered by the (possibly padded) blocks: each drawn cell spans ``cell`` positions, the last
        # block of an axis may be cut short by the axis limits
        span = n * (self.cell or math.ceil(self.seq_len / n))
        if n == self.seq_len:
            span = n
        im = ax.imshow(self.m, cmap=cmap, norm=norm, origin="upper", interpolation=INTERPOLATION,
                       interpolation_stage="data", extent=(-0.5, span - 0.5, span - 0.5, -0.5),
                       aspect="equal")  # fmt: skip
        ax.set_xlim(-0.5, self.seq_len - 0.5)
        ax.set_ylim(self.seq_len - 0.5, -0.5)
        self._ticks()
        if title:
            ax.set_title(title)
        if colorbar:
            self._colorbar(im, label)

    def _ticks(self) -> None:
        ticks = np.arange(0, self.seq_len, self.step)
        stride = self._label_stride(ticks)
        labels = [f"{t:d}" if k % stride == 0 else "" for k, t in enumerate(ticks)]
        self.ax.set_xticks(ticks, labels=labels)
        self.ax.set_yticks(ticks, labels=labels)
        for spine in self.ax.spines.values():
            spine.set_linewidth(0.5)

    def _label_stride(self, ticks: np.ndarray) -> int:
        """Label every k-th tick so that labels never touch, however narrow the panel is printed."""
        fig = self.ax.get_figure(root=True)
        if fig is None or len(ticks) < 2:
            return 1
        panel_in = self.panel_in or 0.8 * self.ax.get_position().width * fig.get_figwidth()
        size = FontProperties(size=mpl.rcParams["xtick.labelsize"]).get_size_in_points()
        digits = len(str(int(ticks[-1])))
        label_in = (0.5 * digits + 0.5) * size / 72  # digits are ~0.5 em wide; keep a 0.5 em gap
        stride = math.ceil(label_in / (panel_in * self.step / self.seq_len))
        if digits >= 4:  # long labels (1000, 2000, ...) read best when at most 4 share an axis
            stride = max(stride, math.ceil(len(ticks) / 4))
        return max(1, stride)

    def _colorbar(self, im: mpl.image.AxesImage, label: str) -> None:
        fig = self.ax.get_figure(root=False)
        cb = fig.colorbar(im, ax=self.ax, fraction=0.05, pad=0.03, aspect=18, extend=_extend(self.values, im.norm))
        _label_colorbar(cb, label)
        self.colorbar = cb
        cb.outline.set_linewidth(0.5)
        cb.ax.tick_params(width=0.5, length=2.0, pad=1.5)
        if cb.solids is not None:
            cb.solids.set_rasterized(True)
            cb.solids.set_edgecolor("face")


def _bar_length_pt(fig: Figure | SubFigure, bars: Sequence[mpl.colorbar.Colorbar]) -> float | None:
    """The printed length in points of the shortest of ``bars`` once the figure is laid out (the layout engine
    shrinks a 12-head grid's bars at a column's width to about half a panel's width)."""
    if not bars:
        return None
    root = fig.get_figure(root=True)
    engine = root.get_layout_engine()
    if engine is None:
        root.draw_without_rendering()
    else:  # the layout alone places the bars: no draw
        engine.execute(root)
    return min(cb.ax.get_window_extent().height for cb in bars) / root.dpi * 72


class TrimmedFormatter(ScalarFormatter):
    """Matplotlib's plain tick labels without trailing zeros: one rule for every colorbar of a figure, so that 0
    reads "0" on every head (not "0" on one and "0.0" on the next) and 1 reads "1", whatever each bar's step.
    """

    def __call__(self, x: float, pos: int | None = None) -> str:
        text = super().__call__(x, pos)
        if "." in text and "e" not in text.lower():
            text = text.rstrip("0").rstrip(".")
        return "0" if text in ("−0", "-0") else text


@dataclass
class _GridOptions:
    kind: str
    titles: Sequence[str] | None
    shared_scale: bool
    cmap: str | Colormap | None
    log: bool
    style: str | None
    seq_len: int | None
    reduce: str
    max_cells: int
    tick_step: int | None
    causal: bool
    prepared: Reduction | None = None  # set when the matrices come from load_heads (drawn as they are)
    block: int = 1  # positions per cell of the matrices given (a summary's block size)
    suptitle: str | None = None
    ranges: list[ValueRange] | None = None  # each head's values at full resolution (scales and arrows)


class _GridPainter:
    """Prepares the matrices (mask, reduce, scales) and lays the panels out 3 per row."""

    def __init__(self, data: np.ndarray, **options: object) -> None:
        self.opt = _GridOptions(**options)  # type: ignore[arg-type]
        arr = np.asarray(data)
        if arr.ndim != 3 or arr.shape[1] != arr.shape[2]:
            raise ValueError(f"expected a (head, query, key) array, got shape {arr.shape}")
        if self.opt.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {self.opt.kind!r}")
        self.n_heads = arr.shape[0]
        self.seq_len = self.opt.seq_len or arr.shape[-1]
        self.reduction = Reduction(self.seq_len, 1, self.opt.reduce)
        if self.opt.prepared is not None:  # drawn as given: no copy, no second mask or reduction
            self.reduction, self.mats = self.opt.prepared, arr.astype(np.float32, copy=False)
        else:
            self.mats = self._prepare(arr)
        titles = self.opt.titles or [f"Head {h}" for h in range(1, self.n_heads + 1)]
        if len(titles) != self.n_heads:
            raise ValueError(f"{len(titles)} titles for {self.n_heads} heads")
        self.titles = list(titles)

    def _prepare(self, arr: np.ndarray) -> np.ndarray:
        mats = np.array(arr, dtype=np.float32, copy=True)
        if self.opt.causal:
            mats[:, ~causal_cells(mats.shape[-1])] = np.nan
        if self.opt.ranges is None:
            self.opt.ranges = self._ranges_of(mats)  # before reduction: the scales span every cell
        if mats.shape[-1] > self.opt.max_cells:
            plan = plan_reduction(mats.shape[-1], self.opt.max_cells, self.opt.reduce)
            mats = block_reduce(mats, plan.factor, plan.how)
            self.reduction = plan
        return mats

    def paint(self, fig: Figure | SubFigure | None) -> Figure | SubFigure:
        ctx = paper_context(self.opt.style) if self.opt.style else contextlib.nullcontext(None)
        with ctx as width:
            rows, cols = grid_shape(self.n_heads)
            if fig is None:
                width = width or 6.0
                ratio = 0.8 if width >= 4.0 else 0.74  # narrow figures: colorbar labels shrink the images more
                title = wrap_title(self.opt.suptitle, width) if self.opt.suptitle else ""
                extra = 0.17 * (title.count("\n") + 1) if title else 0.0  # room for the lines above the panels
                fig = Figure(figsize=(width, rows * width / cols * ratio + 0.25 + extra), layout="constrained")
            axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
            scales = self._scales()
            # positions per drawn cell, where known (else inferred from seq_len: a matrix the caller reduced)
            known = self.opt.prepared is not None or self.reduction.factor > 1
            cell = self.opt.block * self.reduction.factor if known else None
            panel_in = figure_width_in(fig) / cols * (0.56 if cols == N_COLS else 0.7)  # image width once laid out
            ranges = self._ranges()
            bars = []
            for h in range(self.n_heads):
                norm, cmap = scales[h]
                painter = _HeatmapPainter(axes[h], self.mats[h], self.seq_len, self.opt.tick_step, panel_in, cell,
                                          ranges[h])  # fmt: skip
                painter.paint(norm, cmap, self.titles[h], colorbar=not self.opt.shared_scale,
                              label=colorbar_label(self.opt.kind, self.opt.log))
                bars += [painter.colorbar] if painter.colorbar is not None else []
            for ax in axes[self.n_heads :]:
                ax.set_visible(False)
            if self.opt.shared_scale and self.n_heads:
                bars.append(self._shared_colorbar(fig, axes[: self.n_heads]))
            # one number format per figure; labels spaced for the shortest bar as laid out
            format_colorbars(bars, nbins=5 if figure_width_in(fig) >= 4.0 else 4, length_pt=_bar_length_pt(fig, bars))
            sizes = font_sizes(figure_width_in(fig))
            fig.supxlabel("Key position", fontsize=sizes["base"])
            fig.supylabel("Query position", fontsize=sizes["base"])
            if self.opt.suptitle:
                fig.suptitle(wrap_title(self.opt.suptitle, figure_width_in(fig), sizes["base"]), fontsize=sizes["base"])
        fig.biasviz_reduction = self.reduction.describe()  # type: ignore[union-attr]
        return fig

    def _ranges(self) -> list[ValueRange]:
        return self.opt.ranges if self.opt.ranges is not None else self._ranges_of(self.mats)

    def _ranges_of(self, mats: np.ndarray) -> list[ValueRange]:
        return [ValueRange.of(m, ValueRange.needs_percentile(self.opt.kind)) for m in mats]

    def _scales(self) -> list[tuple[Normalize, Colormap]]:
        return head_scales(self.mats, self.opt.kind, shared_scale=self.opt.shared_scale, log=self.opt.log,
                           cmap=self.opt.cmap, ranges=self._ranges())  # fmt: skip

    def _shared_colorbar(self, fig: Figure | SubFigure, axes: np.ndarray) -> mpl.colorbar.Colorbar:
        images = axes[0].get_images()
        cb = fig.colorbar(images[0], ax=list(axes), fraction=0.03, pad=0.02, aspect=40,
                          extend=_extend(ValueRange.joined(self._ranges()), images[0].norm))  # fmt: skip
        _label_colorbar(cb, colorbar_label(self.opt.kind, self.opt.log) + ", one scale for all heads")
        cb.outline.set_linewidth(0.5)
        cb.ax.tick_params(width=0.5, length=2.0, pad=1.5)
        if cb.solids is not None:
            cb.solids.set_rasterized(True)
            cb.solids.set_edgecolor("face")
        return cb


__all__ = ["KINDS", "DEFAULT_CMAPS", "figure_width_in", "head_heatmap", "head_grid", "head_scales", "grid_shape",
           "panel_cells", "tick_step_for"]
