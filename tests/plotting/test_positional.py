"""The figures of docs/positional.md drawn from a summary (:mod:`biasviz.plotting.positional`): the sinks figure's 95 %
band, against the file's stored values."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from biasviz.store.reader import open_bias_file
from tests.plotting.test_measures_plots import Z95, _summary


def test_sinks_figure_shades_the_key_profile_95_band(tmp_path: Path) -> None:
    from biasviz.plotting.positional import sinks_figure

    f = open_bias_file(_summary(tmp_path / "a.h5", "alibi", samples=5))
    mean = f.summary_array("weights_key_profile", 1)[0][:, :16]
    se = f.summary_array("weights_key_profile_se", 1)[:, :16]
    fig = sinks_figure(f, 1, scheme="alibi")
    for h, ax in enumerate(a for a in fig.axes if a.get_visible()):
        np.testing.assert_allclose(ax.lines[0].get_ydata(), mean[h], rtol=1e-6)
        verts = ax.collections[0].get_paths()[0].vertices[:, 1]
        assert np.isclose(verts.max(), (mean[h] + Z95 * se[h]).max(), rtol=1e-6)
        assert np.isclose(verts.min(), (mean[h] - Z95 * se[h]).min(), rtol=1e-6)
    assert "95% interval" in fig._suptitle.get_text()
