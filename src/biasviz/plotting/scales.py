"""Colour scales of the heatmaps: one family of map per figure, diverging at 0 when values change sign.

Shared by ``biasviz plot`` (:mod:`.heatmap`) and the explorer, so that a page shows the colours of the figure.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib as mpl
import numpy as np
from matplotlib.colors import Colormap, LogNorm, Normalize, TwoSlopeNorm

from biasviz.common.errors import BiasvizError

#: What a panel can show: a bias, attention weights, or the standard deviation over samples of either.
KINDS = ("bias", "weights", "bias_std", "weights_std", "positional", "scores", "scores_std")
#: Default maps: perceptual sequential maps; a diverging map (white at 0) when values change sign.
DEFAULT_CMAPS = {"bias": "viridis", "weights": "magma", "bias_std": "viridis", "weights_std": "magma",
                 "positional": "RdBu_r", "scores": "viridis", "scores_std": "viridis",
                 "diverging": "RdBu_r"}  # fmt: skip
#: Values below this fraction of the largest magnitude count as rounding noise when testing for a sign change.
SIGN_TOLERANCE = 1e-3
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


def _scale(
    values: np.ndarray | ValueRange, kind: str, log: bool, cmap: str | Colormap | None, diverging: bool | None = None
) -> tuple[Normalize, Colormap]:
    """Norm and colormap for ``values`` (or their :class:`ValueRange`): log for weights on request, diverging
    at 0 on a sign change.

    ``diverging`` forces the choice (a grid makes it once for all its panels, so that one figure
    never mixes a diverging and a sequential map); None decides from ``values``.
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
        if kind == "weights_std":
            hi = max(r.top, 0.0) or hi
        return Normalize(vmin=0.0, vmax=hi if hi > 0 else 1.0), _colormap(cmap, DEFAULT_CMAPS[kind])
    if _changes_sign(lo, hi) if diverging is None else diverging:
        return centred_norm(lo, hi), _colormap(cmap, DEFAULT_CMAPS["diverging"])
    if kind == "weights":  # heavy-tailed: the few largest weights would leave every other cell black
        hi = r.top if r.top > lo else hi
    if lo == hi:  # constant: give the colorbar a visible range around the value
        lo, hi = lo - 0.5, hi + 0.5
    return Normalize(vmin=lo, vmax=hi), _colormap(cmap, DEFAULT_CMAPS[kind])


def centred_norm(lo: float, hi: float) -> TwoSlopeNorm:
    """A diverging scale centred at 0 whose limits are the data's own on each side (lopsided): each sign gets
    its half of the map, so neither half of the colours goes unused. A head of one sign in a diverging figure
    uses the half of its sign (0 stays white in every panel).

    >>> n = centred_norm(-0.8, 0.25); (n.vmin, n.vcenter, n.vmax), float(n(0.25)), float(n(-0.4))
    ((-0.8, 0.0, 0.25), 1.0, 0.25)
    """
    tiny = 1e-9 * max(-lo, hi, 1e-12)
    return TwoSlopeNorm(vcenter=0.0, vmin=min(lo, -tiny), vmax=max(hi, tiny))


def head_scales(mats: np.ndarray | Sequence[np.ndarray], kind: str, *, shared_scale: bool = False,
                log: bool = False, cmap: str | Colormap | None = None,
                ranges: Sequence[ValueRange] | None = None,
                diverging: bool | None = None) -> list[tuple[Normalize, Colormap]]:  # fmt: skip
    """The norm and colour map of each head's panel, as a grid draws them (the explorer reuses them).

    One family of map per figure: diverging for every panel as soon as one changes sign; with
    ``shared_scale`` one scale over all heads together. ``ranges``: each head's values at full resolution
    (:class:`ValueRange`), where ``mats`` were block-reduced for drawing. ``diverging``: True forces a map
    centred at 0 whatever the values (a difference of two files, all 0 where they agree).
    """
    with_top = ValueRange.needs_percentile(kind)
    ranges = list(ranges) if ranges is not None else [ValueRange.of(np.asarray(m), with_top) for m in mats]
    if shared_scale:
        return [_scale(ValueRange.joined(ranges), kind, log, cmap, diverging)] * len(ranges) if ranges else []
    if diverging is None and kind == "positional":  # P drawn relative to a reference: white at the reference
        diverging = True
    if diverging is None:
        diverging = not log and not kind.endswith("_std") and any(_changes_sign(r.lo, r.hi) for r in ranges)
    return [_scale(r, kind, log, cmap, diverging) for r in ranges]


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


__all__ = ["DEFAULT_CMAPS", "KINDS", "LOG_FLOOR", "SIGN_TOLERANCE", "WEIGHTS_PERCENTILE", "ValueRange", "head_scales"]
