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
    assert fig.get_suptitle() == ("Diagnostics per head, layer 3; T = 512, N = 4; each relative to the head's "
                                  "spread over cells")  # fmt: skip
    labels = [ax.get_ylabel() for ax in fig.axes]
    assert labels[0] == "Context dependence\n(spread over inputs)"
    assert all("\n(" in label and "/ std" not in label for label in labels), labels  # each row says what it measures
    assert [ax.get_xlabel() for ax in fig.axes] == ["", "", "Head"]  # once, under the last row


def test_each_metric_axis_marks_where_its_scale_turns_from_linear_to_logarithmic() -> None:
    """The 0 sits on a linear stretch below the first decade: a break mark on both spines says so."""
    from biasviz.plotting.diagnostics_plots import LINTHRESH

    heads = [_Head(h, 0.01 * h, 0.1, 0.0) for h in range(1, 13)]
    fig = diagnostics_figure({"x": heads}, sinks={"x": [0.5] * 12})
    FigureCanvasAgg(fig).draw()
    metric_axes, sink_axis = fig.axes[:3], fig.axes[3]
    for ax in metric_axes:
        marks = [line for line in ax.get_lines() if not line.get_clip_on()]
        assert len(marks) == 4  # two strokes on each spine
        spine_x = ax.transAxes.transform([(0, 0), (1, 0)])[:, 0]
        height = ax.transData.transform([(0, 0.5 * LINTHRESH)])[0, 1]
        for line in marks:
            xy = line.get_transform().transform(np.column_stack([line.get_xdata(), line.get_ydata()]))
            assert np.abs(xy[:, 0].mean() - spine_x).min() < 0.5  # centred on a spine
            assert abs(xy[:, 1].mean() - height) < 3 * fig.dpi / 72  # within 3 pt of the break
    assert not [line for line in sink_axis.get_lines() if not line.get_clip_on()]  # a linear axis: no break
    legend = fig.legends[0]
    assert legend._ncols == len(legend.get_texts()), "one legend row"


@pytest.mark.parametrize(("sample", "said"), [("0", "sample 1 of 3 (the bias depends on the input"),
                                              ("mean", "mean of 3 samples")])  # fmt: skip
def test_a_context_dependent_bias_says_which_sample_it_shows(tmp_path: object, make_bias_file: object,
                                                            capsys: pytest.CaptureFixture[str], sample: str,
                                                            said: str) -> None:  # fmt: skip
    from tests.conftest import run_cli

    f = make_bias_file(tmp_path / "cable.h5", "cable", n=3, heads=3, t=16)
    code, _, err = run_cli(["plot", "--scheme", "cable", "--input", str(f), "--sample", sample, "--format", "svg",
                            "--out-dir", str(tmp_path / "figs")], capsys)  # fmt: skip
    assert code == 0, err
    svg = (tmp_path / "figs" / "cable_bias.svg").read_text()
    assert said in svg and "CABLE bias: final layer, 4 of 4; T = 16; " in svg  # layer, T, then which input


def test_log_scaled_weights_share_one_colorbar_by_default(tmp_path: object, make_bias_file: object,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from tests.conftest import run_cli

    f = make_bias_file(tmp_path / "alibi.h5", "alibi", n=1, heads=6, t=16)
    for extra, bars in (([], 1), (["--per-head-scale"], 6)):
        out = tmp_path / f"figs{bars}"
        code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(f), "--kind", "weights", "--log",
                                "--format", "svg", "--out-dir", str(out), *extra], capsys)  # fmt: skip
        assert code == 0, err
        svg = (tmp_path / f"figs{bars}" / "alibi_weights.svg").read_text()
        assert svg.count("<g id=\"axes_") == 6 + bars, svg.count("<g id=\"axes_")


def _sweep(steps: list[int], n_heads: int = 3, d: int = 200) -> list[tuple[int, list[object]]]:
    class _Profile:
        def __init__(self, head: int, step: int) -> None:
            self.head, self.profile_mean = head, -np.log1p(np.arange(d)) * (1 + step / 1000) * head

    return [(s, [_Profile(h + 1, s) for h in range(n_heads)]) for s in steps]


@pytest.mark.parametrize(("steps", "legend"), [([0, 100, 200, 300], True), (list(range(0, 2000, 100)), False)])
def test_dynamics_has_a_legend_of_few_steps_and_no_light_yellow(steps: list[int], legend: bool) -> None:
    import matplotlib.colors as mcolors

    from biasviz.plotting.dynamics import dynamics_grid

    fig = dynamics_grid(_sweep(steps), style=None, log_distance=True)
    lines = [line for ax in fig.axes for line in ax.get_lines()]
    assert len(lines) == 3 * len(steps)
    for line in lines:  # no line is light on white (relative luminance below that of viridis' yellow end)
        r, g, b = mcolors.to_rgb(line.get_color())
        assert 0.2126 * r + 0.7152 * g + 0.0722 * b < 0.65, (r, g, b)  # yellow ends of maps: 0.7 to 0.9
    if legend:
        texts = [t.get_text() for t in fig.legends[0].get_texts()]
        assert texts == [f"{s:,}" for s in steps]
        colours = {mcolors.to_hex(line.get_color()) for line in lines}
        assert len(colours) == len(steps)  # one colour per step, told apart
    else:
        assert not fig.legends and any(ax.get_label() == "<colorbar>" for ax in fig.axes)
    assert all(ax.get_xscale() == "symlog" for ax in fig.axes if ax.get_lines())


def test_log_distance_applies_to_profiles_and_nothing_else(tmp_path: object, make_bias_file: object,
                                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from tests.conftest import run_cli

    f = make_bias_file(tmp_path / "t5.h5", "t5", n=2, heads=3, t=64)
    code, _, err = run_cli(["plot", "--scheme", "t5", "--input", str(f), "--kind", "profile", "--log-distance",
                            "--format", "svg", "--out-dir", str(tmp_path / "figs")], capsys)  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "figs" / "t5_bias_profile.svg").exists()
    from biasviz.plotting.diagnostics_plots import profile_grid

    class _Diag:
        def __init__(self, head: int) -> None:
            self.head, self.profile_mean, self.profile_std = head, -np.arange(64.0), np.zeros(64)

    fig = profile_grid([_Diag(h) for h in (1, 2, 3)], style=None, log_distance=True)
    assert {ax.get_xscale() for ax in fig.axes if ax.get_lines()} == {"symlog"}
    code, _, err = run_cli(["plot", "--scheme", "t5", "--input", str(f), "--log-distance", "--out-dir",
                            str(tmp_path / "f2")], capsys)  # fmt: skip
    assert code == 2 and "--log-distance applies to a distance axis" in err


def test_at_a_columns_width_each_row_is_labelled_by_its_name_alone() -> None:
    """3.25 in: the rows are too short for a two-line explanation beside them; the names still fit."""
    heads = [_Head(h, 0.01 * h, 0.1, 0.0) for h in range(1, 13)]
    fig = diagnostics_figure({"x": heads}, sinks={"x": [0.5] * 12}, style="icml-column")
    FigureCanvasAgg(fig).draw()
    assert [ax.get_ylabel() for ax in fig.axes] == ["Context\ndependence", "Toeplitz\nresidual",
                                                     "Separability\nresidual", "Sink\nshare"]  # fmt: skip
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:  # each label within its own row's height
        label, box = ax.yaxis.label.get_window_extent(renderer), ax.get_window_extent(renderer)
        assert label.height <= box.height + 1
