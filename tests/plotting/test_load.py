"""Reading the matrices to draw (biasviz.plotting.load): a 4096-position file is drawn from block means, and each
head's colour bar still spans the extremes of every cell it holds, as h5py reads them."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="module")
def long_file(tmp_path_factory: pytest.TempPathFactory, make_bias_file: object) -> object:
    """4096 positions (block-reduced 7 x 7 for drawing), two heads of an ALiBi-like bias and its weights."""
    return make_bias_file(tmp_path_factory.mktemp("long") / "alibi.h5", "alibi", n=1, heads=2, t=4096)



def _colorbar_norms(fig: object) -> list[object]:
    return [ax.get_images()[0].norm for ax in fig.axes if ax.get_images()]



@pytest.mark.parametrize(("kind", "log"), [("bias", False), ("weights", False), ("weights", True)])
def test_colorbar_limits_of_a_4096_position_figure_are_the_data_extremes(long_file: object, kind: str,
                                                                         log: bool) -> None:  # fmt: skip
    import h5py

    from biasviz.plotting.heatmap import head_grid
    from biasviz.plotting.load import load_heads
    from biasviz.plotting.scales import LOG_FLOOR, WEIGHTS_PERCENTILE
    from biasviz.store import causal_cells, open_bias_file

    with open_bias_file(long_file) as bf:
        heads = load_heads(bf, kind, layer=-1, sample=0)
        layer = heads.layer
    assert heads.reduction.factor > 1  # drawn from block means
    fig = head_grid(heads, kind=kind, log=log)
    norms = _colorbar_norms(fig)
    used = causal_cells(4096)
    with h5py.File(long_file) as f:
        for h, norm in enumerate(norms):
            cells = f[f"layer_{layer}/{kind}"][0, h][used]
            if kind == "bias":  # all <= 0: a sequential map from the smallest to the largest value
                assert (norm.vmin, norm.vmax) == (float(cells.min()), float(cells.max()))
            elif log:
                assert norm.vmax == float(cells.max()) == 1.0  # cell (0, 0)
                assert norm.vmin == max(float(cells[cells > 0].min()), LOG_FLOOR)
            else:
                assert norm.vmax == pytest.approx(float(np.percentile(cells, WEIGHTS_PERCENTILE)), rel=1e-6)
    extends = [cb.extend for cb in (ax._colorbar for ax in fig.axes if hasattr(ax, "_colorbar"))]
    if kind == "weights" and not log:
        assert extends and set(extends) == {"max"}  # the clipped largest weights: an arrow
