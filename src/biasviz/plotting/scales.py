"""Colour scales of the heatmaps: one decision per head (:func:`colour_scale`), and the ticks of its colour bar.

Every heatmap of biasviz takes its colours from :func:`colour_scale`: ``biasviz plot`` and the notebook API
(:mod:`.heatmap`), the long-context figure and the explorer page, so that one cell of one file gets one colour
wherever it is drawn. The rules, from a head's values at the finest resolution the file holds (every finite
cell, :class:`ValueRange`):

* values of one sign (or all 0): a sequential map from the head's own minimum to its own maximum; a head whose
  values are all below :data:`ZERO_BELOW` in size (0 within float32 rounding) is drawn as 0 on the all-zero scale;
* values that change sign: a diverging map centred at 0, each side over its own range (lopsided limits when the
  two sides differ: both ends are the data's, and no half of the bar is left empty), except where one side is
  under :data:`NOISE_SHARE` of the range: then the limits are symmetric, +-the largest magnitude, so that a +0.02
  beside -0.93 is pale, not as saturated as -0.93;
* one colour family per figure (:func:`head_scales`): where any head's values change sign, every head is drawn on
  the same diverging map, a head of one sign with symmetric limits about 0 (white), half the bar its own;
* linear attention weights end at their 99.5th percentile (an arrow marks the larger ones); a log scale runs
  from the smallest positive weight (at least 1e-4 of the largest) to the largest; a standard deviation over
  samples runs from 0 to its largest value.

Colour bars are labelled at both ends, with one number format per figure (:func:`format_colorbars`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib as mpl
import numpy as np
from matplotlib.colors import Colormap, LogNorm, Normalize, TwoSlopeNorm
from matplotlib.font_manager import FontProperties

from biasviz.common.errors import BiasvizError
from biasviz.store.datasets import map_name

#: What a panel can show: a bias, attention weights, or the standard deviation over samples of either.
KINDS = ("bias", "weights", map_name("bias", "std"), map_name("weights", "std"), "positional", "scores",
         map_name("scores", "std"))
#: Default maps: perceptual sequential maps; a diverging map (white at 0) when values change sign.
DEFAULT_CMAPS = {"bias": "viridis", "weights": "magma", map_name("bias", "std"): "viridis",
                 map_name("weights", "std"): "magma", "positional": "viridis", "scores": "viridis",
                 map_name("scores", "std"): "viridis",
                 "diverging": "RdBu_r"}  # fmt: skip
#: Values below this fraction of the largest magnitude count as rounding noise when testing for a sign change.
SIGN_TOLERANCE = 1e-3
#: A diverging scale's side under this fraction of its range is noise beside the other: symmetric limits.
NOISE_SHARE = 0.05
#: A head whose every value is this small is 0 within float32's rounding of the sums it is made of (FIRE's MLP at
#: initialisation gives +-1e-9): drawn as 0 on the all-zero scale, never as a diverging bar stretched over noise.
ZERO_BELOW = 1e-6
#: Linear scales of attention weights end at this percentile (the colorbar gets an arrow for larger ones).
WEIGHTS_PERCENTILE = 99.5
#: Lower end of a log scale for attention weights, as a fraction of the largest weight.
LOG_FLOOR = 1e-4



@dataclass(frozen=True)
class ValueRange:
    """What a colour scale is made from: the finite extremes of a matrix at full resolution, its smallest
    positive value (a log scale's floor) and its 99.5th percentile (where a linear weights scale ends).

    Taken from every cell before a long matrix is block-reduced for drawing, so the colorbar spans the data,
    not the block means (ALiBi's bias at 4096 positions reaches 0 on the diagonal; a block mean does not).
    """

    lo: float
    hi: float
    positive: float  # smallest value > 0 (inf when there is none)
    top: float  # the WEIGHTS_PERCENTILE-th percentile

    @classmethod
    def of(cls, values: np.ndarray, percentile: bool = True) -> ValueRange:
        """The range of ``values``; ``percentile=False`` skips the percentile (a partial sort of every cell),
        which only a weights scale reads: ``top`` is then the largest value."""
        finite = np.asarray(values)[np.isfinite(values)]
        if finite.size == 0:
            return cls(0.0, 1.0, np.inf, 1.0)
        pos = finite[finite > 0]
        hi = float(finite.max())
        top = float(np.percentile(finite, WEIGHTS_PERCENTILE)) if percentile else hi
        return cls(float(finite.min()), hi, float(pos.min()) if pos.size else np.inf, top)

    @staticmethod
    def needs_percentile(kind: str) -> bool:
        """Whether a scale of ``kind`` ('bias', 'weights_std', 'bias_mean', ...) reads :attr:`top`."""
        return kind.startswith("weights")

    @classmethod
    def joined(cls, ranges: Sequence[ValueRange]) -> ValueRange:
        """One range over several heads (the percentile: the largest head's, an upper bound of the joint one)."""
        return cls(min(r.lo for r in ranges), max(r.hi for r in ranges), min(r.positive for r in ranges),
                   max(r.top for r in ranges))  # fmt: skip


#: Masked cells (a key after its query): the first of these greys that no colour of the map comes near (a pale
#: yellow for a map of greys).
MASKED_CANDIDATES = ((0.82, 0.82, 0.82), (0.55, 0.55, 0.55), (0.30, 0.30, 0.30), (1.0, 0.93, 0.62))
MASKED_DISTANCE = 0.12  # the least RGB distance between the masked colour and any colour a value maps to


def masked_color(cmap: Colormap) -> tuple[float, float, float]:
    """The neutral colour masked cells get under ``cmap``: a grey that no value maps to, so that a value of 0
    (white in a diverging map) never looks masked.

    >>> masked_color(mpl.colormaps["RdBu_r"]), masked_color(mpl.colormaps["Greys"])
    ((0.82, 0.82, 0.82), (1.0, 0.93, 0.62))
    """
    table = cmap(np.linspace(0.0, 1.0, 256))[:, :3]
    for grey in MASKED_CANDIDATES:
        if float(np.min(np.linalg.norm(table - np.asarray(grey), axis=1))) >= MASKED_DISTANCE:
            return grey
    return MASKED_CANDIDATES[-1]


def _colormap(cmap: str | Colormap | None, default: str = "viridis") -> Colormap:
    """A copy of the named map with NaN (masked cells) in its neutral :func:`masked_color` (seaborn names such as
    'rocket' work too)."""
    if isinstance(cmap, Colormap):
        base = cmap
    else:
        name = cmap or default
        try:
            base = mpl.colormaps[name]
        except KeyError:
            with contextlib.suppress(ImportError):
                import seaborn  # noqa: F401  (registers 'rocket', 'mako', 'vlag', 'icefire', ...)
            try:
                base = mpl.colormaps[name]
            except KeyError:
                raise BiasvizError(f"unknown colormap '{name}'; use a matplotlib or seaborn name such as "
                                   "viridis, magma, rocket, mako, RdBu_r, vlag") from None  # fmt: skip
    return base.with_extremes(bad=(*masked_color(base), 1.0))


def _changes_sign(lo: float, hi: float) -> bool:
    scale = max(abs(lo), abs(hi))
    return lo < -SIGN_TOLERANCE * scale and hi > SIGN_TOLERANCE * scale


def colour_scale(
    values: np.ndarray | ValueRange, kind: str = "bias", *, log: bool = False, cmap: str | Colormap | None = None
) -> tuple[Normalize, Colormap]:
    """The norm and colour map of one head (or of heads sharing one scale): the single decision every heatmap
    and the explorer use, so that a value gets the same colour wherever it is drawn (rules: module docstring).

    ``values``: the head's matrix, or its :class:`ValueRange` taken at full resolution before a long matrix was
    block-reduced for drawing (a block mean does not reach the data's extremes).

    >>> n, _ = colour_scale(ValueRange(-0.8, 0.25, 0.25, 0.25)); (n.vmin, n.vcenter, n.vmax)
    (-0.8, 0.0, 0.25)
    >>> n, _ = colour_scale(ValueRange(-3.0, 0.0, np.inf, 0.0)); type(n).__name__, n.vmin, n.vmax
    ('Normalize', -3.0, 0.0)
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    r = values if isinstance(values, ValueRange) else ValueRange.of(values, ValueRange.needs_percentile(kind))
    lo, hi = r.lo, r.hi
    if log:
        if hi <= 0:
            raise BiasvizError("a log colour scale needs positive values (it is meant for attention weights)")
        floor = max(r.positive, hi * LOG_FLOOR)
        return LogNorm(vmin=min(floor, hi), vmax=hi, clip=True), _colormap(cmap, DEFAULT_CMAPS[kind])
    if kind.endswith("_std"):  # a spread over samples: from 0, never diverging (all 0 for a context-free bias)
        if kind == map_name("weights", "std"):
            hi = max(r.top, 0.0) or hi
        return Normalize(vmin=0.0, vmax=hi if hi > 0 else 1.0), _colormap(cmap, DEFAULT_CMAPS[kind])
    if max(abs(lo), abs(hi)) < ZERO_BELOW and not kind.startswith("weights"):
        return Normalize(vmin=0.0, vmax=1.0), _colormap(cmap, DEFAULT_CMAPS[kind])  # 0 within rounding
    if _changes_sign(lo, hi):
        return centred_norm(lo, hi), _colormap(cmap, DEFAULT_CMAPS["diverging"])
    if kind == "weights":  # heavy-tailed: the few largest weights would leave every other cell black
        hi = r.top if r.top > lo else hi
    if lo == hi:  # one value throughout: a range from 0 to it (all 0: from 0 to 1), the value at one end
        lo, hi = (min(lo, 0.0), max(hi, 0.0)) if lo != 0.0 else (0.0, 1.0)
    return Normalize(vmin=lo, vmax=hi), _colormap(cmap, DEFAULT_CMAPS[kind])


def centred_norm(lo: float, hi: float) -> TwoSlopeNorm:
    """A diverging scale centred at 0 whose ends are the data's own ``lo`` < 0 < ``hi``: each sign over its half of
    the map, so the palest colour is 0 and each end the largest value of its sign (for values that change sign;
    :func:`colour_scale` decides). Where the smaller side is under :data:`NOISE_SHARE` of the range, the limits are
    +-the larger magnitude instead: a side that small would otherwise take half the colours.

    >>> n = centred_norm(-0.8, 0.25); (n.vmin, n.vcenter, n.vmax), float(n(0.25)), float(n(-0.4)), float(n(0))
    ((-0.8, 0.0, 0.25), 1.0, 0.25, 0.5)
    >>> n = centred_norm(-0.93, 0.02); (n.vmin, n.vmax), round(float(n(0.02)), 3), float(n(-0.93))
    ((-0.93, 0.93), 0.511, 0.0)
    """
    lo, hi = min(lo, -1e-30), max(hi, 1e-30)
    if min(-lo, hi) < NOISE_SHARE * (hi - lo):
        lo, hi = -max(-lo, hi), max(-lo, hi)
    return TwoSlopeNorm(vcenter=0.0, vmin=lo, vmax=hi)


def symmetric(norm: Normalize) -> bool:
    """Whether a diverging scale's limits are +-one magnitude (:func:`centred_norm`'s noise rule, or a head of one
    sign on a figure's diverging map), rather than each side's own extreme."""
    return isinstance(norm, TwoSlopeNorm) and abs(float(norm.vmin) + float(norm.vmax)) <= 1e-9 * float(norm.vmax)


def one_family(scales: list[tuple[Normalize, Colormap]],
               ranges: Sequence[ValueRange]) -> list[tuple[Normalize, Colormap]]:  # fmt: skip
    """The heads of one figure on one colour family: where any head's scale is diverging, every linear head that is
    not is drawn on the same diverging map with symmetric limits about 0, +-its largest magnitude (1 for a head
    that is 0 within rounding), so that white is 0 in every panel and a sign reads the same everywhere. Log
    scales and spreads (from 0, never diverging) are left as they are.

    >>> rs = [ValueRange(-2.0, 1.0, 1.0, 1.0), ValueRange(-4.0, -1.0, np.inf, -1.0)]
    >>> [(type(n).__name__, n.vmin, n.vmax, c.name) for n, c in one_family([colour_scale(r) for r in rs], rs)]
    [('TwoSlopeNorm', -2.0, 1.0, 'RdBu_r'), ('TwoSlopeNorm', -4.0, 4.0, 'RdBu_r')]
    """
    diverging = [c for n, c in scales if isinstance(n, TwoSlopeNorm)]
    if not diverging:
        return scales
    out = []
    for (norm, cm), r in zip(scales, ranges, strict=True):
        if isinstance(norm, (TwoSlopeNorm, LogNorm)):
            out.append((norm, cm))
            continue
        m = max(abs(r.lo), abs(r.hi))
        m = m if m >= ZERO_BELOW else 1.0
        out.append((TwoSlopeNorm(vcenter=0.0, vmin=-m, vmax=m), diverging[0]))
    return out


def head_scales(mats: np.ndarray | Sequence[np.ndarray], kind: str, *, shared_scale: bool = False,
                log: bool = False, cmap: str | Colormap | None = None,
                ranges: Sequence[ValueRange] | None = None) -> list[tuple[Normalize, Colormap]]:  # fmt: skip
    """The norm and colour map of each head's panel (:func:`colour_scale` per head), as a grid draws them and
    the explorer colours its cells; with ``shared_scale`` one scale over all heads together. ``ranges``: each
    head's values at full resolution (:class:`ValueRange`), where ``mats`` were block-reduced for drawing.
    """
    with_top = ValueRange.needs_percentile(kind)
    ranges = list(ranges) if ranges is not None else [ValueRange.of(np.asarray(m), with_top) for m in mats]
    if shared_scale:
        return [colour_scale(ValueRange.joined(ranges), kind, log=log, cmap=cmap)] * len(ranges) if ranges else []
    scales = [colour_scale(r, kind, log=log, cmap=cmap) for r in ranges]
    return scales if log or kind.endswith("_std") else one_family(scales, ranges)


def _extend(values: np.ndarray | ValueRange, norm: Normalize) -> str:
    """Which ends of the colorbar get an arrow: those where the data pass the scale (clipped weights, a log
    scale's floor)."""
    r = values if isinstance(values, ValueRange) else ValueRange.of(values, percentile=False)  # extremes only
    vmin, vmax = norm.vmin, norm.vmax
    if vmin is None or vmax is None:
        return "neither"
    slack = 1e-6 * max(abs(vmin), abs(vmax), 1e-12)
    low = r.lo < vmin - slack
    high = r.hi > vmax + slack
    return {(True, True): "both", (True, False): "min", (False, True): "max"}.get((low, high), "neither")


#: Interior ticks of a colour bar keep this fraction of its length from either end (the end labels' room).
END_ROOM = 0.18
MOST_DECIMALS = 6


def bar_ticks(vmin: float, vmax: float, *, log: bool = False, nbins: int = 4, centred: bool = False) -> list[float]:
    """Where a colour bar is labelled: both ends (the scale's limits) and the round values between them that
    keep :data:`END_ROOM` from the ends (``nbins`` 0: none but 0, for a short bar; below 0: the ends alone); 0 on
    a scale that crosses it,
    unless its label would touch an end's.

    >>> bar_ticks(-7.3, 0.0)
    [-7.3, -4.0, -2.0, 0.0]
    >>> bar_ticks(-19.5, 0.004), bar_ticks(-0.02, 0.03, nbins=0)
    ([-19.5, -15.0, -10.0, -5.0, 0.004], [-0.02, 0.0, 0.03])
    >>> bar_ticks(-0.8, 0.8)
    [-0.8, -0.5, 0.0, 0.5, 0.8]

    ``centred``: a diverging bar with each sign over its half (:func:`centred_norm`), where a value sits at its
    place on the bar, not in proportion to the data: each half gets round values of its own, 0 at the middle.

    >>> bar_ticks(-0.93, 0.02, centred=True)
    [-0.93, -0.5, 0.0, 0.01, 0.02]
    """
    from matplotlib.ticker import LogLocator, MaxNLocator

    if not vmax > vmin:
        return [vmin]
    if nbins < 1:  # the ends alone (and 0 between them, unless ``nbins`` < 0): a bar too short for more labels
        inner = np.array([0.0]) if vmin < 0 < vmax and nbins == 0 else np.array([])
        span, where = vmax - vmin, lambda t: t - vmin
    elif log:
        inner = LogLocator(base=10.0, numticks=8).tick_values(vmin, vmax)
        span, where = np.log10(vmax / vmin), lambda t: np.log10(t / vmin)
    elif centred and vmin < 0 < vmax:
        half = MaxNLocator(nbins=max(1, nbins // 2), steps=[1, 2, 5, 10])
        inner = np.unique(np.concatenate([half.tick_values(vmin, 0.0), half.tick_values(0.0, vmax)]))
        span, where = 1.0, lambda t: 0.5 * (t - vmin) / -vmin if t < 0 else 0.5 + 0.5 * t / vmax
    else:
        inner = MaxNLocator(nbins=nbins, steps=[1, 2, 5, 10]).tick_values(vmin, vmax)
        span, where = vmax - vmin, lambda t: t - vmin
    keep = [float(t) for t in inner if END_ROOM <= where(t) / span <= 1 - END_ROOM
            or (t == 0.0 and END_ROOM / 2 <= where(t) / span <= 1 - END_ROOM / 2)]  # fmt: skip
    return [float(vmin), *keep, float(vmax)]


def _decimals(value: float) -> int:
    """The fewest decimals that write a round tick value exactly (at most :data:`MOST_DECIMALS`)."""
    for k in range(MOST_DECIMALS + 1):
        if abs(round(value, k) - value) <= 1e-9 * max(abs(value), 1e-12):
            return k
    return MOST_DECIMALS


def linear_decimals(ticks: Sequence[float]) -> int:
    """Decimals for a linear bar with ``ticks`` (its ends first and last): two significant digits of its span,
    and enough for every round value between the ends.

    >>> linear_decimals([-7.3, -6.0, -4.0, -2.0, 0.0]), linear_decimals([0.0, 0.5, 1.0]), linear_decimals([-1300, 0])
    (1, 1, 0)
    """
    span = abs(ticks[-1] - ticks[0])
    need = 1 - int(np.floor(np.log10(span))) if span > 0 else 0
    return min(MOST_DECIMALS, max([need, 0, *(_decimals(t) for t in ticks[1:-1])]))


def tick_text(value: float, decimals: int | None) -> str:
    """One tick label: ``decimals`` fixed decimals (a linear bar), or two significant digits (``None``: a log
    bar); a typographic minus, and never "−0".

    >>> [tick_text(v, 1) for v in (-7.34, -0.01, 2.0)], tick_text(0.000123, None)
    (['−7.3', '0.0', '2.0'], '0.00012')
    """
    text = f"{value:.2g}" if decimals is None else f"{value:.{decimals}f}"
    if float(text) == 0.0:
        text = text.lstrip("-")
    return text.replace("-", "\N{MINUS SIGN}")


def spaced_ticks(ticks: Sequence[float], norm: Normalize, gap: float) -> list[float]:
    """``ticks`` (ends first and last) less the interior ones whose place on the bar (``norm``: 0 .. 1) is within
    ``gap`` of an end or of a tick kept before them; 0 is kept first, then the others in order. On a short bar (a
    12-head grid at a column's width: 0.6 in) a lopsided diverging scale puts its round values of one half next
    to an end; their labels touched.

    >>> spaced_ticks([-7.94, -5.0, 0.0, 0.01, 0.02], TwoSlopeNorm(0.0, -7.94, 0.02), gap=0.2)
    [-7.94, 0.0, 0.01, 0.02]
    """
    if len(ticks) < 3:
        return list(ticks)
    kept = [ticks[0], ticks[-1]]
    for t in sorted(ticks[1:-1], key=lambda t: t != 0.0):
        if all(abs(float(norm(t)) - float(norm(k))) >= gap for k in kept):
            kept.append(t)
    return sorted(kept)


def format_colorbars(bars: Sequence[mpl.colorbar.Colorbar], nbins: int = 4, at_least: int = 0,
                     length_pt: float | None = None) -> int:  # fmt: skip
    """Label every colour bar of one figure at both ends and at round values between, in one number format for
    the whole figure: the same decimals on every linear bar (the most any bar needs, and ``at_least``: what other
    axes of the figure need), two significant digits on log bars. Returns the decimals, for those other axes.
    ``length_pt``: the printed length of the shortest bar, in points: labels keep 1.5 lines apart on it."""
    size = FontProperties(size=mpl.rcParams["ytick.labelsize"]).get_size_in_points()
    plan = []
    for cb in bars:
        norm = cb.norm
        log = isinstance(norm, LogNorm)
        centred = isinstance(norm, TwoSlopeNorm)
        ticks = bar_ticks(float(norm.vmin), float(norm.vmax), log=log, nbins=nbins, centred=centred)
        if length_pt:
            ticks = spaced_ticks(ticks, norm, 1.5 * size / length_pt)
        plan.append((cb, log, ticks))
    linear = [ticks for _, log, ticks in plan if not log]
    decimals = max([at_least, *(linear_decimals(t) for t in linear)])
    for cb, log, ticks in plan:
        cb.set_ticks(ticks, labels=[tick_text(t, None if log else decimals) for t in ticks])
        cb.minorticks_off()
    return decimals



__all__ = ["DEFAULT_CMAPS", "KINDS", "LOG_FLOOR", "SIGN_TOLERANCE", "WEIGHTS_PERCENTILE", "ZERO_BELOW", "ValueRange",
           "bar_ticks", "colour_scale", "format_colorbars", "head_scales", "spaced_ticks", "tick_text"]
