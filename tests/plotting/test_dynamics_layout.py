"""The training-dynamics figures as a reviewer reads them at a column's and a page's width: no two texts overlap once
drawn, no text is below 6 pt, one tick format, and the title says what is shown. The helpers below check the
long-context figure too (test_long_context.py) and the measures page (test_measures_page.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.axis import Axis
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from biasviz.plotting.diagnostics_plots import NOISE
from biasviz.plotting.style import venue_width


def drawn_texts(fig: Figure) -> list[tuple[str, float, Any]]:
    """(text, size in points, window extent) of every text the drawn figure shows (tick labels out of view left out)."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    hidden: set[int] = set()
    for axis in fig.findobj(Axis):
        shown = {id(t) for t in axis._update_ticks()}
        for tick in axis.get_major_ticks() + axis.get_minor_ticks():
            if id(tick) not in shown:
                hidden.update((id(tick.label1), id(tick.label2)))
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip() and id(t) not in hidden]
    return [(t.get_text(), t.get_fontsize(), t.get_window_extent(renderer)) for t in texts]


def overlaps(texts: list[tuple[str, float, Any]]) -> list[tuple[str, str]]:
    """Pairs of texts whose boxes overlap by more than a pixel each way."""
    out = []
    for k, (a, _, box_a) in enumerate(texts):
        for b, _, box_b in texts[k + 1 :]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > 1 and dy > 1:
                out.append((a, b))
    return out


def check_print(fig: Figure, style: str) -> list[tuple[str, float, Any]]:
    """The figure is as wide as the style prints, no text below 6 pt and no two texts overlapping."""
    assert fig.get_figwidth() == pytest.approx(venue_width(style))
    texts = drawn_texts(fig)
    small = sorted({(text, size) for text, size, _ in texts if size < 6.0})
    assert not small, small
    assert not overlaps(texts), overlaps(texts)
    return texts


# -- the training dynamics ----------------------------------------------------------------------------


class _Head:
    def __init__(self, head: int, step: int, d: int = 200) -> None:
        self.head, self.samples = head, 4
        self.profile_mean = -np.log1p(np.arange(d)) * (1 + step / 1000) * head / 5
        self.context_dependence = 0.0 if head % 2 else 3e-8  # a context-free bias: 0, or float32 rounding
        self.toeplitz_residual = 0.02 * head * (1 + step / 300)


def _sweep(steps: list[int], heads: int = 12) -> list[tuple[int, list[_Head]]]:
    return [(s, [_Head(h + 1, s) for h in range(heads)]) for s in steps]


def _tick_labels(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_xticklabels() if t.get_text()]


@pytest.mark.parametrize("style", ["icml", "icml-column"])
@pytest.mark.parametrize("log_distance", [False, True])
def test_dynamics_grid_says_what_it_shows_in_one_tick_format(style: str, log_distance: bool) -> None:
    from biasviz.plotting.dynamics import dynamics_grid

    title = "alibi bias over training: layer 1, T = 200, mean over 4 samples and the cells at each distance"
    fig = dynamics_grid(_sweep([0, 100, 200, 300]), style=style, log_distance=log_distance, title=title)
    check_print(fig, style)
    assert fig.get_suptitle().replace("\n", " ") == title
    labels = _tick_labels(fig)
    assert labels and not [s for s in labels if s.endswith(".0") or s in ("-0", "\u22120") or "$" in s], labels


@pytest.mark.parametrize("style", ["icml", "icml-column"])
def test_over_training_draws_rounding_as_a_hollow_zero_and_titles_what_it_measured(style: str) -> None:
    from biasviz.plotting.dynamics import over_training

    fig = over_training(_sweep(list(range(0, 2000, 100))), style=style, title="alibi diagnostics, layer 1")
    texts = [t for t, _, _ in check_print(fig, style)]
    assert fig.get_suptitle().replace("\n", " ").startswith("alibi diagnostics, layer 1; each relative to")
    assert any("hollow: 0" in t for t in texts)
    top = fig.axes[0]  # context dependence: exact zeros and rounding (3e-8) both drawn hollow at 0
    hollow = [line for line in top.get_lines() if line.get_markerfacecolor() == "white" and len(line.get_ydata())]
    assert hollow and all(np.all(np.asarray(line.get_ydata()) == 0) for line in hollow)
    filled = [line for line in top.get_lines() if line.get_markerfacecolor() != "white"
              and line.get_label().startswith("Head")]  # fmt: skip
    assert all(not line.get_markevery() for line in filled), "no value below the noise floor gets a filled marker"
    breaks = [line for line in top.get_lines() if not line.get_clip_on()]
    assert len(breaks) == 4, "a break mark on both spines where the axis turns from linear to logarithmic"
    assert all(float(np.asarray(line.get_ydata()).min()) >= NOISE for line in fig.axes[1].get_lines()
               if line.get_label().startswith("Head"))  # fmt: skip


def test_plot_kind_dynamics_titles_the_figure_from_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            figures: dict[str, Any]) -> None:  # fmt: skip
    from tests.conftest import run_cli
    from tests.explorer.test_build import STEPS, SWEEP_T, write_sweep

    src = write_sweep(tmp_path / "sweep.h5")
    code, _, err = run_cli(["plot", "--scheme", "cable", "--input", str(src), "--kind", "dynamics", "--style", "icml",
                            "--width", "column", "--format", "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    fig = figures["cable_dynamics"]
    check_print(fig, "icml-column")
    title = fig.get_suptitle().replace("\n", " ")
    assert title.startswith(f"CABLE bias over training: layer 2 of 4; T = {SWEEP_T}; mean of 2 samples"), title
    assert f"checkpoints of {STEPS[0]} to {STEPS[-1]:,} steps" in title, title

