"""Figures a reviewer accepts as they are: what each one shows is checked against the data, pixel by pixel
where it matters (no colour that is not on the colorbar) and against h5py where it is a number.
"""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize

from biasviz.plotting.diagnostics_plots import NOISE, diagnostics_figure
from biasviz.plotting.heatmap import head_heatmap


def _stripes(t: int) -> np.ndarray:
    """A T5-like bias: a few discrete values in stripes one position wide along the diagonals."""
    d = np.subtract.outer(np.arange(t), np.arange(t))
    return (np.minimum(d, 7) % 4).astype(np.float32)


@pytest.mark.parametrize("t", [48, 200, 600])
def test_bucket_stripes_draw_only_colours_on_the_colorbar(t: int) -> None:
    values = _stripes(t)
    norm = Normalize(0, 3)
    ax = head_heatmap(values, norm=norm, cmap="viridis", colorbar=False, causal=False, tick_step=t)
    fig = ax.get_figure()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    x0, y0, x1, y1 = ax.get_window_extent().extents
    height = rgba.shape[0]
    inner = rgba[int(height - y1) + 2 : int(height - y0) - 2, int(x0) + 2 : int(x1) - 2].reshape(-1, 3)
    import matplotlib as mpl

    allowed = np.round(np.array([mpl.colormaps["viridis"](norm(v))[:3] for v in range(4)]) * 255).astype(int)
    distance = np.abs(inner[:, None, :] - allowed[None]).max(axis=-1).min(axis=1)
    assert distance.max() <= 1, f"{int((distance > 1).sum())} pixels hold colours that are not on the colorbar"


class _Head:
    def __init__(self, head: int, cd: float | None, tr: float, sr: float) -> None:
        self.head, self.context_dependence, self.toeplitz_residual, self.separability_residual = head, cd, tr, sr
        self.samples = 4


def _markers(fig: object) -> list[tuple[np.ndarray, str]]:
    """(y values, face colour) of every marker line in the figure's axes."""
    out = []
    for ax in fig.axes:
        for line in ax.get_lines():
            if line.get_marker() not in (None, "None", "") and len(line.get_ydata()):
                out.append((np.asarray(line.get_ydata(), float), str(line.get_markerfacecolor())))
    return out


def test_float32_noise_is_drawn_as_zero_and_the_figure_says_what_it_measured() -> None:
    heads = [_Head(h, 0.0, 0.0, 4.4e-8 if h % 3 else 0.0) for h in range(1, 13)]  # ALiBi's rounding noise
    cable = [_Head(h, 0.2, 0.05, 1e-5) for h in range(1, 13)]  # 1e-5 is above the tolerance: structure
    fig = diagnostics_figure({"alibi": heads, "cable": cable}, details={"alibi": "T = 512, N = 4",
                             "cable": "T = 512, N = 4"}, title="Diagnostics per head, layer 3")  # fmt: skip
    FigureCanvasAgg(fig).draw()
    hollow = [y for y, face in _markers(fig) if face == "white"]
    filled = [y for y, face in _markers(fig) if face != "white"]
    assert all(np.all(np.abs(y) < NOISE) for y in hollow) and all(np.all(np.abs(y) >= NOISE) for y in filled)
    assert sum(y.size for y in hollow) == 12 * 3 + 0  # every alibi value (incl. its 8 noisy ones) is hollow
    assert fig.get_suptitle() == "Diagnostics per head, layer 3; T = 512, N = 4"
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels[0].startswith("Context dependence\n(") and "std" in labels[0]
    assert all("\n(" in label for label in labels), labels  # each row says what it measures
    legend = fig.legends[0]
    assert legend._ncols == len(legend.get_texts()), "one legend row"
