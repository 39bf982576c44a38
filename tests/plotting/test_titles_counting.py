"""One counting rule wherever an index is shown or taken: options, files and the Python API count layers and
samples from 0 (as stored); figure text counts them as ordinals, from 1, as it counts heads.

Each sample of the file below has its own bias, -(k + 1) * (i - j) for sample k, so which sample a figure draws can
be read from the drawn cells, independently of the title that names it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import biasviz
from tests.cli.test_plot_cmd import _dist, write_file

N, T = 3, 16


@pytest.fixture(scope="module")
def per_sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    heads = np.arange(1, 13, dtype=np.float32)[:, None, None]  # head h (from 1) scaled by h
    bias = np.stack([-(k + 1) * heads * np.maximum(_dist(T), 0) for k in range(N)]).astype(np.float32)
    return write_file(tmp_path_factory.mktemp("count") / "cable.h5", "cable", bias, n=N, t=T)


@pytest.mark.parametrize("k", [0, 2])
def test_the_title_names_the_sample_sample_k_draws_and_the_api_reads(per_sample: Path, k: int) -> None:
    fig = biasviz.plot(per_sample, kind="bias", sample=k)
    title = fig.get_suptitle()
    assert f"sample {k + 1} of {N}" in title, title  # --sample k is the (k + 1)-th
    assert "final layer, 4 of 4" in title  # the file's layer_3, as --layer 3 takes it
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert panels[0].get_title() == "Head 1" and panels[4].get_title() == "Head 5"
    drawn = panels[4].get_images()[0].get_array()  # head 5: -(k + 1) * 5 * (i - j)
    assert float(drawn.min()) == pytest.approx(-(k + 1) * 5 * (T - 1))
    with biasviz.open(per_sample) as view:
        assert view.layers[-1] == 3
        read = view.bias(sample=k, head=5)
    assert float(np.nanmin(read)) == pytest.approx(-(k + 1) * 5 * (T - 1))
    assert f"sample {k + 1} of {N}" in fig.biasviz_caption
