"""The side-by-side figure of positional logits (make figures' positional.pdf): each map's colours come from the
heatmaps' one colour-scale decision (FIGURES.md item 4), every colour bar says its quantity, and every label of the
figure has one number format (item 5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import biasviz
from biasviz.plotting.positional_compare import compare_figure
from tests.conftest import small_model


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("pos")
    model = small_model("alibi")
    paths = []
    for t, name in ((16, "short.h5"), (32, "long.h5")):
        ids = np.random.default_rng(t).integers(0, 90, size=(3, t))
        biasviz.extract(model, ids, d / name, layers=-1, summary=True, resolution=t, device="cpu", progress=False)
        paths.append(d / name)
    return paths[0], paths[1]


def test_each_map_is_on_the_heatmaps_colour_scale_with_labelled_bars_in_one_format(pair: tuple[Path, Path]) -> None:
    import h5py

    from tests.plotting.colour_rule import expected_limits

    fig = compare_figure([pair])
    maps = [ax for ax in fig.axes if ax.get_images() and ax.get_label() != "<colorbar>"]
    assert len(maps) == 2
    assert maps[0].get_title().split("\n")[0] == "ALiBi"  # as the long-context and measures figures write it
    drawn = []
    for ax, path in zip(maps, pair, strict=True):
        image = ax.get_images()[0]
        with h5py.File(path) as f:
            layer = next(k for k in f if k.startswith("layer_"))
            p = f[f"{layer}/positional_mean"][()] - f[f"{layer}/positional_profile"][0][:, :1, None]
        values = np.ma.filled(np.ma.asarray(image.get_array(), dtype=np.float64), np.nan)
        head = next(h for h in range(p.shape[0]) if np.allclose(values, p[h], equal_nan=True))
        drawn.append((image, p[head]))
    # the figure's one rule over both lengths' maps: a head diverging at one length is diverging at the other
    for (image, _), (lo, hi, centred) in zip(drawn, expected_limits([m for _, m in drawn]), strict=True):
        assert hasattr(image.norm, "vcenter") == centred
        assert image.get_cmap().name == drawn[0][0].get_cmap().name
        assert (image.norm.vmin, image.norm.vmax) == pytest.approx((lo, hi), rel=1e-6)
    fig.canvas.draw()
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 2 and all(b.get_xlabel() == "P(i, j) − P(0)\n(logits)" for b in bars)  # each says its quantity
    labels = [t.get_text() for b in bars for t in b.get_xticklabels() if t.get_text()]
    labels += [t.get_text() for ax in fig.axes[-1:] for t in ax.get_yticklabels() if t.get_text()]  # P(d) axis
    decimals = {len(t.split(".")[1]) if "." in t else 0 for t in labels}
    assert len(decimals) == 1, labels  # one number format: never "−1.3k" beside "0.56"
    assert not any("-" in t or t.endswith("k") for t in labels)  # the minus sign, never a hyphen
    assert all(len(b.get_xticks()) >= 2 for b in bars)  # both ends labelled


def test_at_a_pages_width_every_bars_end_labels_stay_apart_and_inside_the_figure(
    pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seven models at 5.5 in (make figures' positional.pdf): each bar's two end labels are drawn, inside the
    figure, inside their own column (left one from the bar's left end, right one up to its right end) and apart
    from every other text of the figure; no text below 6 pt (FIGURES.md items 5 and 6).

    The two files are this test's own, read fourteen times: the child process that checks a file from elsewhere
    before it is opened (biasviz.store.guard, a Python start each, about a third of the figure's time) is left out
    here. The test above opens them through it; what is drawn is read from the files the same way."""
    import biasviz.store.reader
    from tests.plotting.test_dynamics_layout import check_print

    monkeypatch.setattr(biasviz.store.reader, "check_isolated", lambda path: None)
    fig = compare_figure([pair] * 7, style="neurips")
    check_print(fig, "neurips")  # drawn: no two texts overlap, none below 6 pt
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 14
    page = fig.bbox
    for bar in bars:
        labels = [t for t in bar.get_xticklabels() if t.get_text()]
        crosses = bar.get_xlim()[0] < 0 < bar.get_xlim()[1]  # a diverging bar: a tick at its 0, labelled where
        assert not crosses or 0.0 in list(bar.get_xticks())  # the label fits between the ends' labels
        assert len(labels) in (2, 2 + crosses), [t.get_text() for t in labels]  # both ends labelled
        assert len(labels) == 2 or float(labels[1].get_text().replace("\N{MINUS SIGN}", "-")) == 0.0
        lo, hi = (t.get_window_extent() for t in (labels[0], labels[-1]))
        ramp = bar.get_window_extent()
        for box in (lo, hi):
            assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, box
        assert lo.x0 >= ramp.x0 - 1 and hi.x1 <= ramp.x1 + 1, (lo, hi, ramp)  # within the bar's own column
        apart = lo.x1 < hi.x0 or lo.y0 >= hi.y1 or hi.y0 >= lo.y1
        assert apart, (labels[0].get_text(), labels[1].get_text(), lo, hi)
    others = [ax for ax in bars if ax is not bars[0]]
    assert all(not bars[0].get_window_extent().overlaps(ax.get_window_extent()) for ax in others)


def _pair(d: Path, scheme: str, samples: int) -> tuple[Path, Path]:
    model = small_model(scheme)
    paths = []
    for t in (16, 32):
        ids = np.random.default_rng(t).integers(0, 90, size=(samples, t))
        biasviz.extract(model, ids, d / f"{scheme}{t}.h5", layers=-1, summary=True, resolution=t, device="cpu",
                        progress=False)  # fmt: skip
        paths.append(d / f"{scheme}{t}.h5")
    return paths[0], paths[1]


def test_the_mapped_heads_profile_has_its_95_percent_band_where_the_file_holds_its_se(tmp_path: Path) -> None:
    """RoPE with 3 samples stores positional_profile_se: the red head's P(d) - P(0) lies in a band of ±1.96 SE of P(d)
    read from the file; with 2 samples no SE is stored, and no band is drawn (FIGURES.md: bands wherever an SE
    exists)."""
    import h5py
    from matplotlib.collections import PolyCollection

    with_se = _pair(tmp_path, "rope", 3)
    fig = compare_figure([with_se])
    profile_ax = next(ax for ax in fig.axes if ax.get_lines())
    bands = [c for c in profile_ax.collections if isinstance(c, PolyCollection)]
    assert len(bands) == 1
    red = next(line for line in profile_ax.get_lines() if line.get_linewidth() == 1.2)
    with h5py.File(with_se[1]) as f:
        layer = next(k for k in f if k.startswith("layer_"))
        se = f[f"{layer}/positional_profile_se"][0]
        mean = f[f"{layer}/positional_profile"][0]
    head = next(h for h in range(len(mean)) if np.allclose(red.get_ydata(), mean[h, 1:] - mean[h, 0]))
    vertices = bands[0].get_paths()[0].vertices
    width = 2 * 1.959963984540054 * se[head, 1:]  # the band's height at each distance
    top = {x: y for x, y in vertices}  # a polygon: lower edge then upper; the dict keeps the last (upper) y
    lower = {x: y for x, y in vertices[::-1]}
    drawn = np.array([top[x] - lower[x] for x in np.arange(2, 32)])  # (the polygon's first point is its closing one)
    np.testing.assert_allclose(drawn, width[1:], rtol=1e-5, atol=1e-7)
    assert "95 % interval" in fig.get_supxlabel().replace("\n", " ")
    fig = compare_figure([_pair(tmp_path, "nope", 2)])
    assert not [c for ax in fig.axes if ax.get_lines() for c in ax.collections if isinstance(c, PolyCollection)]
    assert "interval" not in fig.get_supxlabel()
