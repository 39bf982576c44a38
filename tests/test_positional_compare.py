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

    from biasviz.plotting.scales import ValueRange, colour_scale

    fig = compare_figure([pair])
    maps = [ax for ax in fig.axes if ax.get_images() and ax.get_label() != "<colorbar>"]
    assert len(maps) == 2
    for ax, path in zip(maps, pair, strict=True):
        image = ax.get_images()[0]
        with h5py.File(path) as f:
            layer = next(k for k in f if k.startswith("layer_"))
            p = f[f"{layer}/positional_mean"][()] - f[f"{layer}/positional_profile"][0][:, :1, None]
        values = np.ma.filled(np.ma.asarray(image.get_array(), dtype=np.float64), np.nan)
        head = next(h for h in range(p.shape[0]) if np.allclose(values, p[h], equal_nan=True))
        want, _ = colour_scale(ValueRange.of(p[head], percentile=False), "positional")  # the one decision
        assert type(image.norm) is type(want)
        assert (image.norm.vmin, image.norm.vmax) == pytest.approx((want.vmin, want.vmax), rel=1e-6)
    fig.canvas.draw()
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 2 and all(b.get_xlabel() == "P(i, j) − P(0)\n(logits)" for b in bars)  # each says its quantity
    labels = [t.get_text() for b in bars for t in b.get_xticklabels() if t.get_text()]
    labels += [t.get_text() for ax in fig.axes[-1:] for t in ax.get_yticklabels() if t.get_text()]  # P(d) axis
    decimals = {len(t.split(".")[1]) if "." in t else 0 for t in labels}
    assert len(decimals) == 1, labels  # one number format: never "−1.3k" beside "0.56"
    assert not any("-" in t or t.endswith("k") for t in labels)  # the minus sign, never a hyphen
    assert all(len(b.get_xticks()) >= 2 for b in bars)  # both ends labelled
