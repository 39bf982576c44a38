"""The page's colour tables (:mod:`biasviz.explorer.colors`) are matplotlib's colour maps."""

from __future__ import annotations

import numpy as np

from biasviz.explorer.colors import colormap_table


def test_colour_tables_are_matplotlibs() -> None:
    import matplotlib as mpl

    for name in ("viridis", "magma", "RdBu_r"):
        expected = mpl.colormaps[name](np.linspace(0, 1, 256), bytes=True)[:, :3]
        assert np.array_equal(colormap_table(name), expected)
