"""Small per-head tables of the page: distance profiles, and colour scales as JSON.

Split from :mod:`.build` so that the packing of matrices and these side tables read on their own.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from biasviz.explorer.encode import pack_bytes


def distance_profile(m: np.ndarray) -> dict[str, Any]:
    """Mean and standard deviation of the cells at each distance d = i - j (NaN cells left out).

    Causal matrices give d = 0 .. T-1; others -(T-1) .. T-1 (``d0`` is the first d).
    """
    n = m.shape[-1]
    d0 = -(n - 1) if np.isfinite(m[0, 1:]).any() else 0
    rows, cols = np.nonzero(np.isfinite(m))  # every diagonal at once: a loop over T diagonals took 6 s a page
    values = m[rows, cols].astype(np.float64)
    d = rows - cols - d0  # the diagonal's index, 0 .. n - d0 - 1
    count = np.bincount(d, minlength=n - d0)
    with np.errstate(invalid="ignore", divide="ignore"):  # a diagonal with no finite cell: NaN, as before
        mean = np.bincount(d, weights=values, minlength=n - d0) / count
        std = np.sqrt(np.bincount(d, weights=(values - mean[d]) ** 2, minlength=n - d0) / count)  # two passes
    mean, std = mean.astype(np.float32), std.astype(np.float32)
    return {"d0": d0, "mean": pack_bytes(mean.astype("<f4").tobytes()), "std": pack_bytes(std.astype("<f4").tobytes())}


def profile_json(profiles: tuple[np.ndarray, ...], head: int) -> dict[str, Any]:
    """One head's stored profile as the page reads it (as :func:`distance_profile` packs a computed one)."""
    mean, std, start = profiles
    return {"d0": int(start), "mean": pack_bytes(np.asarray(mean[head], "<f4").tobytes()),
            "std": pack_bytes(np.asarray(std[head], "<f4").tobytes())}  # fmt: skip


def scale_json(scale: tuple[Any, Any], zero: bool = False, over: bool = False) -> list[Any]:
    """``[vmin, vmax, colour map]``, plus ``"log"`` for a logarithmic scale, ``"centred"`` for a diverging one
    centred at 0 (each sign over its half, as :func:`biasviz.plotting.scales.colour_scale` decides) or ``"zero"``
    where every value is 0 within rounding (``zero``: the scale then runs 0 to 1 with nothing at 1); then
    ``"over"`` where values lie above vmax (``over``: a weights scale ends at the 99.5th percentile, where ``plot``
    draws an arrow), so that the bar's top says so.

    >>> from matplotlib.colors import Normalize
    >>> scale_json((Normalize(0.0, 0.25), type("Map", (), {"name": "magma"})()), over=True)
    [0.0, 0.25, 'magma', '', 'over']
    """
    from matplotlib.colors import LogNorm, TwoSlopeNorm

    norm, cmap = scale
    out = [float(norm.vmin), float(norm.vmax), str(cmap.name)]
    mode = "log" if isinstance(norm, LogNorm) else "centred" if isinstance(norm, TwoSlopeNorm) else \
        "zero" if zero else ""  # fmt: skip
    return [*out, mode, "over"] if over else [*out, mode] if mode else out


__all__ = ["distance_profile", "profile_json", "scale_json"]
