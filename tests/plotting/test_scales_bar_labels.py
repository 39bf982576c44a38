"""Colour bar labels never touch, on the short bars of a 12-head grid at a column's width (3.25 in)."""

from __future__ import annotations

import numpy as np

from biasviz.plotting import head_grid


def test_lopsided_bars_at_a_column_width_keep_their_labels_apart() -> None:
    t = 64
    d = np.subtract.outer(np.arange(t), np.arange(t)).astype(np.float32)
    # a head mostly below 0 with a sliver above it (P near the diagonal): the lopsided diverging bar of the
    # positional grid, whose round values of the short half sat next to its end
    mats = np.stack([-(h + 1) * d / t + np.where(d == 0, 0.02, 0.0) for h in range(12)])
    fig = head_grid(mats, kind="positional", style="icml-column")
    fig.draw_without_rendering()
    renderer = fig._get_renderer()
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 12
    for bar in bars:
        boxes = sorted((t.get_window_extent(renderer) for t in bar.get_yticklabels() if t.get_text()),
                       key=lambda b: b.y0)  # fmt: skip
        assert len(boxes) >= 2
        for low, high in zip(boxes, boxes[1:], strict=False):
            assert high.y0 >= low.y1, [t.get_text() for t in bar.get_yticklabels()]
