"""What the figures draw: panels, titles, ticks, colorbars, blank masked cells, scales."""

from __future__ import annotations

import matplotlib as mpl
import numpy as np
import pytest
from matplotlib.colors import LogNorm
from matplotlib.figure import Figure

from biasviz.diagnostics.measures import diagnose_array
from biasviz.plotting.diagnostics_plots import diagnostics_figure, profile_grid
from biasviz.plotting.heatmap import grid_shape, head_grid, head_heatmap, tick_step_for
from biasviz.plotting.reduce import plan_reduction
from biasviz.plotting.style import VENUE_WIDTHS, paper_context, venue_width


def alibi(n_heads: int = 12, t: int = 256) -> np.ndarray:
    slopes = 2.0 ** (-8 * np.arange(1, n_heads + 1) / n_heads)
    pos = np.arange(t)
    d = (pos[:, None] - pos[None, :]).astype(np.float32)
    b = -slopes[:, None, None] * d
    b[:, d < 0] = np.nan
    return b.astype(np.float32)


def image_axes(fig: Figure) -> list:
    return [ax for ax in fig.axes if ax.get_images()]


@pytest.fixture(scope="module")
def grid() -> Figure:
    return head_grid(alibi())


def test_grid_has_twelve_titled_panels_in_four_rows(grid: Figure) -> None:
    panels = image_axes(grid)
    assert len(panels) == 12
    assert [ax.get_title() for ax in panels] == [f"Head {h}" for h in range(1, 13)]
    rows = sorted({round(ax.get_subplotspec().rowspan.start) for ax in panels})
    assert rows == [0, 1, 2, 3] and grid_shape(12) == (4, 3)


def test_ticks_every_100_positions_and_query_axis_downward(grid: Figure) -> None:
    for ax in image_axes(grid):
        np.testing.assert_array_equal(ax.get_xticks(), [0, 100, 200])
        np.testing.assert_array_equal(ax.get_yticks(), [0, 100, 200])
        assert ax.yaxis_inverted()  # query 0 at the top
        assert not ax.xaxis_inverted()
        im = ax.get_images()[0]
        assert im.origin == "upper"


def test_one_colorbar_per_panel(grid: Figure) -> None:
    panels = image_axes(grid)
    assert all(ax.get_images()[0].colorbar is not None for ax in panels)
    colorbars = [ax for ax in grid.axes if ax.get_label() == "<colorbar>"]
    assert len(colorbars) == 12


def test_masked_cells_have_their_own_neutral_colour(grid: Figure) -> None:
    from biasviz.plotting.scales import masked_color

    im = image_axes(grid)[0].get_images()[0]
    arr = im.get_array()
    assert np.ma.is_masked(arr)
    upper = np.triu(np.ones(arr.shape, dtype=bool), k=1)
    assert arr.mask[upper].all() and not arr.mask[~upper].any()
    assert tuple(im.cmap.get_bad()) == (*masked_color(im.cmap), 1.0)  # opaque, a colour no value maps to


def test_sequential_scale_for_one_signed_bias_diverging_at_zero_otherwise() -> None:
    fig = head_grid(alibi(3))
    norm = fig.axes[0].get_images()[0].norm
    assert norm.vmax == pytest.approx(0.0) and norm.vmin < 0
    mixed = alibi(3) + 0.5 * 2.0 ** (-8 * np.arange(1, 4) / 3)[:, None, None] * 100
    fig = head_grid(mixed)
    lower = np.tril(np.ones(mixed.shape[1:], bool))
    for h, ax in enumerate(image_axes(fig)):
        norm = ax.get_images()[0].norm  # centred at 0, from the head's own minimum to its own maximum
        cells = mixed[h][lower]
        assert norm.vcenter == 0.0
        assert norm.vmin == pytest.approx(cells.min()) and norm.vmax == pytest.approx(cells.max())


def test_shared_scale_uses_one_norm_and_one_colorbar() -> None:
    fig = head_grid(alibi(6), shared_scale=True)
    norms = {(ax.get_images()[0].norm.vmin, ax.get_images()[0].norm.vmax) for ax in image_axes(fig)}
    assert len(norms) == 1
    assert len([ax for ax in fig.axes if ax.get_label() == "<colorbar>"]) == 1


def test_weights_log_scale_blanks_the_masked_zeros() -> None:
    w = np.tril(np.full((5, 64, 64), 0.02, dtype=np.float32))
    w[:, np.arange(64), np.arange(64)] = 0.5
    fig = head_grid(w, kind="weights", log=True)
    im = fig.axes[0].get_images()[0]
    assert isinstance(im.norm, LogNorm) and im.norm.vmin > 0
    assert im.get_array().mask[0, 1]


def test_general_head_count_hides_unused_panels() -> None:
    fig = head_grid(alibi(5, t=32))
    assert len(image_axes(fig)) == 5
    assert grid_shape(5) == (2, 3)
    assert sum(not ax.get_visible() for ax in fig.axes) == 1


def test_head_heatmap_draws_into_a_given_axes() -> None:
    fig = Figure()
    ax = fig.add_subplot()
    out = head_heatmap(alibi(1, t=32)[0], ax=ax, title="Head 3")
    assert out is ax and ax.get_title() == "Head 3"
    np.testing.assert_array_equal(ax.get_xticks(), [0, 10, 20, 30])


def test_grid_draws_into_a_given_figure_and_subfigure() -> None:
    fig = Figure(figsize=(8, 6), layout="constrained")
    left, right = fig.subfigures(1, 2)
    assert head_grid(alibi(3, t=32), fig=left) is left
    assert len(image_axes(fig)) == 3 and not right.axes


def test_narrow_styles_thin_the_tick_labels_but_keep_the_ticks() -> None:
    wide = head_grid(alibi(3, t=512), style="icml").axes[0]
    narrow = head_grid(alibi(3, t=512), style="acl-column").axes[0]
    assert [t.get_text() for t in wide.get_xticklabels()] == ["0", "100", "200", "300", "400", "500"]
    assert [t.get_text() for t in narrow.get_xticklabels()] == ["0", "", "200", "", "400", ""]
    np.testing.assert_array_equal(narrow.get_xticks(), wide.get_xticks())


def test_figure_width_is_the_venue_text_width() -> None:
    assert head_grid(alibi(3, t=32), style="acl").get_figwidth() == pytest.approx(6.3)
    assert venue_width("icml-column") == 3.25 and VENUE_WIDTHS["neurips"] == 5.5
    before = mpl.rcParams["axes.titlesize"], mpl.rcParams["svg.fonttype"]
    with paper_context("iclr") as width:
        assert width == 5.5 and mpl.rcParams["axes.titlesize"] == 9 and mpl.rcParams["pdf.fonttype"] == 42
    assert (mpl.rcParams["axes.titlesize"], mpl.rcParams["svg.fonttype"]) == before  # nothing global changed


def test_tick_steps() -> None:
    assert tick_step_for(512) == 100 and tick_step_for(4096) == 1000 and tick_step_for(32) == 10


def test_large_matrices_are_reduced_before_drawing() -> None:
    t = 1300
    fig = head_grid(alibi(3, t=t), max_cells=600)
    ax = fig.axes[0]
    assert ax.get_images()[0].get_array().shape == (434, 434)
    assert ax.get_xlim() == (-0.5, t - 0.5)
    assert "block mean 3x3" in fig.biasviz_reduction
    assert plan_reduction(4096).factor == 7


def test_diagnostics_figures(tmp_path) -> None:
    fixed = np.stack([alibi(12, t=32)] * 2)
    rng = np.random.default_rng(0)
    varying = fixed + rng.normal(size=fixed.shape).astype(np.float32)
    results = {"alibi": diagnose_array(fixed), "cable": diagnose_array(varying)}
    fig = diagnostics_figure(results)
    metric_axes = [ax for ax in fig.axes if ax.get_ylabel()]
    labels = [ax.get_ylabel() for ax in metric_axes]
    assert [label.split("\n")[0] for label in labels] == ["Context dependence", "Toeplitz residual",
                                                        "Separability residual"]
    assert all(ax.get_yscale() == "symlog" for ax in metric_axes)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:2] == ["alibi", "cable"]
    prof = profile_grid(results["cable"])
    panels = [ax for ax in prof.axes if ax.get_visible()]
    assert [ax.get_title() for ax in panels] == [f"Head {h}" for h in range(1, 13)]
    assert all(ax.collections for ax in panels)  # the +-1 std band


def test_linear_weights_scale_clips_the_heavy_tail_with_an_arrow() -> None:
    w = np.tril(np.random.default_rng(0).uniform(0, 0.02, (3, 64, 64))).astype(np.float32)
    w[:, [0, 1, 2], [0, 1, 0]] = 0.9  # a few large weights, as in the first rows of real attention
    im = head_grid(w, kind="weights").axes[0].get_images()[0]
    assert im.norm.vmax < 1.0 and im.colorbar.extend == "max"


def test_each_head_gets_its_own_limits_on_one_diverging_map_where_one_changes_sign() -> None:
    bias = alibi(3, 64)
    bias[0] += 5.0  # only head 1 changes sign (from about -5 to +5)
    fig = head_grid(bias)
    lower = np.tril(np.ones(bias.shape[1:], bool))
    axes = image_axes(fig)
    first = axes[0].get_images()[0].norm
    ends = (bias[0][lower].min(), bias[0][lower].max())
    assert first.vcenter == 0.0 and (first.vmin, first.vmax) == pytest.approx(ends)
    for h, ax in enumerate(axes[1:], start=1):  # one sign, on the figure's one map: white at 0, +-its magnitude
        im = ax.get_images()[0]
        m = np.abs(bias[h][lower]).max()
        assert im.get_cmap().name == axes[0].get_images()[0].get_cmap().name == "RdBu_r"
        assert im.norm.vcenter == 0.0 and (im.norm.vmin, im.norm.vmax) == pytest.approx((-m, m), abs=1e-6)
    plain = image_axes(head_grid(alibi(3, 64)))  # no head changes sign: each sequential over its own range
    assert all(ax.get_images()[0].get_cmap().name.startswith("viridis") for ax in plain)


def test_unclipped_negative_bias_has_no_colorbar_arrow() -> None:
    bias = alibi(3, 64) - 0.25  # all negative: vmax < 0 must not read as clipped
    fig = head_grid(bias)
    colorbars = [ax for ax in fig.axes if not ax.get_images() and ax.collections]
    assert colorbars and all(cb._colorbar.extend == "neither" for cb in colorbars)


def test_a_grid_leaves_the_callers_settings_alone_and_styles_only_when_asked() -> None:
    before = dict(mpl.rcParams)
    plain = head_grid(alibi(3, t=32))
    styled = head_grid(alibi(3, t=32), style="icml")
    assert styled.get_figwidth() == pytest.approx(VENUE_WIDTHS["icml"]) != plain.get_figwidth()
    with paper_context("icml"):
        titlesize = mpl.rcParams["axes.titlesize"]
    assert styled.axes[0].title.get_fontsize() == pytest.approx(titlesize)
    assert plain.axes[0].title.get_fontsize() != pytest.approx(titlesize)
    assert dict(mpl.rcParams) == before


def test_matrices_prepared_by_load_heads_are_drawn_as_they_are(tmp_path) -> None:
    from biasviz.plotting.load import HeadMatrices
    from biasviz.plotting.reduce import Reduction

    data = alibi(3, t=32)
    data[:, np.triu(np.ones((32, 32), dtype=bool), k=1)] = np.nan
    prepared = HeadMatrices(data=data, seq_len=64, layer=1, sample="0", reduction=Reduction(64, 2, "mean"))
    fig = head_grid(prepared)
    shown = image_axes(fig)[0].get_images()[0].get_array()
    np.testing.assert_array_equal(np.ma.filled(shown, np.nan), data[0])  # no second mask, copy or reduction
    np.testing.assert_array_equal(image_axes(fig)[0].get_xticks(), [0, 20, 40, 60])  # ticks in positions of T = 64
    assert "2" in fig.biasviz_reduction


@pytest.mark.parametrize(("kind", "log", "label"), [("bias", False, "bias b(i, j)"),
                                                    ("weights", True, "attention weight, log scale")])  # fmt: skip
def test_every_colorbar_says_what_it_shows_in_print_sized_text(kind: str, log: bool, label: str) -> None:
    data = alibi(3) if kind == "bias" else np.exp(alibi(3)) / np.exp(alibi(3)).sum(-1, keepdims=True)
    fig = head_grid(data, kind=kind, log=log, style="icml-column")
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 3
    for bar in bars:
        text = bar.yaxis.label
        assert text.get_text() == label and text.get_fontsize() >= 6.0
    shared = head_grid(alibi(3), shared_scale=True)
    (bar,) = [ax for ax in shared.axes if ax.get_label() == "<colorbar>"]
    assert bar.yaxis.label.get_text() == "bias b(i, j), one scale for all heads"


def test_a_grid_is_laid_out_to_space_its_colour_bars_but_not_drawn(monkeypatch) -> None:
    """The bars' printed length (their labels are spaced for it) comes from the layout engine alone: painting a grid
    draws nothing; its files draw it (tests/plotting/test_save.py counts those draws)."""
    from matplotlib.figure import Figure

    drawn = []
    draw = Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: drawn.append(renderer) or draw(fig, renderer))
    fig = head_grid(alibi(3, t=32))
    assert drawn == []
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]  # each head's, placed by the layout
    assert len(bars) == 3 and all(bar.get_window_extent().height > 20 for bar in bars)
