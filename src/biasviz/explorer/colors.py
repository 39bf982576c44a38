"""The colour maps of `biasviz plot` as 256-entry RGB tables, so the page colours cells exactly as the figures do."""

from __future__ import annotations

import numpy as np

from biasviz.explorer.encode import pack_bytes

#: Entries per table: matplotlib's own resolution for its named maps.
N_COLORS = 256


def colormap_table(name: str) -> np.ndarray:
    """(256, 3) uint8 RGB: entry k is the colour matplotlib gives values in [k/256, (k+1)/256) of the scale.

    >>> colormap_table("viridis")[0].tolist()
    [68, 1, 84]
    """
    from biasviz.plotting.heatmap import _colormap

    return _colormap(name)(np.arange(N_COLORS), bytes=True)[:, :3]  # matplotlib's own 8-bit rounding


def colormap_tables() -> dict[str, str]:
    """Every default map of `biasviz plot`, base64 RGB triples by name."""
    from biasviz.plotting.heatmap import DEFAULT_CMAPS

    return {name: pack_bytes(colormap_table(name).tobytes()) for name in sorted(set(DEFAULT_CMAPS.values()))}


def masked_colors() -> dict[str, list[int]]:
    """Every default map's colour of masked cells, 8-bit RGB by name, as the figures draw them."""
    import matplotlib as mpl

    from biasviz.plotting.heatmap import DEFAULT_CMAPS
    from biasviz.plotting.scales import masked_color

    return {name: [round(255 * c) for c in masked_color(mpl.colormaps[name])]
            for name in sorted(set(DEFAULT_CMAPS.values()))}  # fmt: skip


__all__ = ["N_COLORS", "colormap_table", "colormap_tables", "masked_colors"]
