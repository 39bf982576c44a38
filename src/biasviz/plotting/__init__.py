"""Paper figures of positional attention biases: per-head heatmaps and diagnostics drawings.

The public functions take an Axes or Figure (or create one) and return it, for composing figures::

    from biasviz.plotting import head_grid, save_figure
    fig = head_grid(bias)            # (head, query, key) -> 4 x 3 panels for 12 heads
    save_figure(fig, "alibi_bias", ["pdf", "png"])

Names are imported on first use, so ``biasviz --help`` does not pay for importing matplotlib.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "head_grid": "heatmap", "head_heatmap": "heatmap", "grid_shape": "heatmap", "tick_step_for": "heatmap",
    "block_reduce": "reduce", "plan_reduction": "reduce", "save_figure": "save", "paper_context": "style",
    "venue_width": "style", "VENUE_WIDTHS": "style", "diagnostics_figure": "diagnostics_plots",
    "profile_grid": "diagnostics_plots", "profile_axes": "diagnostics_plots", "load_heads": "load",
    "load_summary_heads": "load", "weighted_block_mean": "reduce", "file_profiles": "profiles",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'biasviz.plotting' has no attribute {name!r}")
    return getattr(importlib.import_module(f"biasviz.plotting.{_EXPORTS[name]}"), name)


__all__ = sorted(_EXPORTS)
