"""The side-by-side figure of positional logits (make figures' positional.pdf): each map's colours come from its own
extremes on each side of 0 (FIGURES.md item 4), a map of one sign shows only its half of the bar, and every label
of the figure has one number format (item 5)."""

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


def test_each_map_is_coloured_from_its_own_extremes_in_one_number_format(pair: tuple[Path, Path]) -> None:
    import h5py

    fig = compare_figure([pair])
    maps = [ax for ax in fig.axes if ax.get_images()]
    assert len(maps) == 2
    for ax, path in zip(maps, pair, strict=True):
        image = ax.get_images()[0]
        with h5py.File(path) as f:
            layer = next(k for k in f if k.startswith("layer_"))
            p = f[f"{layer}/positional_mean"][()] - f[f"{layer}/positional_profile"][0][:, :1, None]
        values = np.asarray(image.get_array().filled(np.nan) if np.ma.isMaskedArray(image.get_array())
                            else image.get_array())  # fmt: skip
        head = next(h for h in range(p.shape[0]) if np.allclose(values, p[h], equal_nan=True))
        lo, hi = np.nanmin(p[head]), np.nanmax(p[head])
        norm = image.norm
        assert norm(0.0) == pytest.approx(0.5)  # white at P(0)
        if lo < -1e-3 * max(-lo, hi) and hi > 1e-3 * max(-lo, hi):  # both signs: lopsided, each its own end
            assert (norm.vmin, norm.vmax) == pytest.approx((lo, hi))
        else:  # one sign: its own end, and the bar shows only that half
            bar = next(a for a in fig.axes if a is not ax and a.get_xlim()[0] <= 0 <= a.get_xlim()[1]
                       and a.get_position().y1 < ax.get_position().y0 + 1e-9 and not a.get_images())  # fmt: skip
            assert 0.0 in bar.get_xlim()
    fig.canvas.draw()
    labels = [t.get_text() for a in fig.axes for t in a.get_xticklabels() + a.get_yticklabels()
              if t.get_text() and not t.get_text().startswith("$")]  # mathtext: the log axis's powers of ten
    assert not any("-" in t for t in labels)  # the minus sign, never a hyphen
    assert not any(t.rstrip("0") != t and "." in t for t in labels)  # no trailing zeros: "0", never "0.00"
