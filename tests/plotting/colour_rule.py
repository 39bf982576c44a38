"""The heatmaps' colour rule written out independently of biasviz's scale objects, for the tests to compare with.

From each panel's finite values (every cell at full resolution) alone: a panel whose values change sign (beyond a
thousandth of its largest magnitude) is diverging, centred at 0, each side to its own extreme, unless its smaller
side is under a twentieth of its range (then +-its largest magnitude); where any panel of a figure diverges, every
other panel is drawn on the same diverging map from minus to plus its largest magnitude (1 for a panel that is 0
within 1e-6); where none does, each panel is sequential over its own range (0 to 1 for a panel of zeros).
"""

from __future__ import annotations

import numpy as np


def expected_limits(panels: list[np.ndarray]) -> list[tuple[float, float, bool]]:
    """(vmin, vmax, centred) of each panel of one figure (``centred``: the diverging map, white at 0)."""
    ranges = []
    for values in panels:
        finite = np.asarray(values, dtype=np.float64)
        finite = finite[np.isfinite(finite)]
        ranges.append((float(finite.min()), float(finite.max())))

    def changes(lo: float, hi: float) -> bool:
        m = max(abs(lo), abs(hi))
        return m >= 1e-6 and lo < -1e-3 * m and hi > 1e-3 * m

    diverging = any(changes(lo, hi) for lo, hi in ranges)
    out = []
    for lo, hi in ranges:
        m = max(abs(lo), abs(hi))
        if changes(lo, hi) and min(-lo, hi) >= (hi - lo) / 20:
            out.append((lo, hi, True))
        elif diverging:
            m = m if m >= 1e-6 else 1.0
            out.append((-m, m, True))
        elif m < 1e-6:
            out.append((0.0, 1.0, False))
        else:
            out.append((lo, hi, False))
    return out


def place(v: float, vmin: float, vmax: float, centred: bool) -> float:
    """Where a value lands on its map, 0 .. 1: each sign over its half of a centred map, else linear."""
    if centred:
        return 0.5 * (v - vmin) / -vmin if v < 0 else 0.5 + 0.5 * v / vmax
    return (v - vmin) / (vmax - vmin)
