"""The one-page figure of docs/position-measures.md that ``make figures`` draws (``biasviz.plotting.measures_page``):
what each panel draws is the file's stored means and 95 % bands for the heads it names, a model without rotary pairs
says so, and it prints at a column's and a page's width with no overlapping or too small text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import biasviz
from biasviz.plotting.measures_page import chosen_heads, main, measures_page
from biasviz.store.datasets import DIRECT_DISTANCES
from biasviz.store.reader import open_bias_file
from tests.conftest import small_model
from tests.plotting.test_dynamics_layout import check_print

Z95 = 1.959963984540054
TRAINING = '{"preset": "tiny", "steps": 300, "seq_len": 128, "corpus": "stdlib:/x"}'


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """RoPE (half of each head rotated: the unrotated row must stay out of the pairs) and ALiBi, 5 samples of 48."""
    import h5py

    root = tmp_path_factory.mktemp("page")
    ids = np.random.default_rng(3).integers(0, 97, size=(5, 48))
    out = []
    for scheme, options in (("rope", {"scheme_options": {"fraction": 0.5}}), ("alibi", {})):
        path = root / f"{scheme}.h5"
        biasviz.extract(small_model(scheme, n_head=4, **options), ids, path, summary=True, device="cpu",
                        progress=False, resolution=12)  # fmt: skip
        with h5py.File(path, "r+") as f:
            f.attrs["training"] = TRAINING
        out.append(path)
    return out


def test_the_three_heads_are_ranked_by_their_weight_on_short_distances() -> None:
    bins = np.array([[0, 0], [15, 15], [16, 30]])
    mass = np.array([[0.3, 0.2, 0.5], [0.1, 0.1, 0.8], [0.6, 0.3, 0.1], [0.25, 0.2, 0.55], [0.4, 0.0, 0.6]])
    local = mass[:, bins[:, 1] < DIRECT_DISTANCES].sum(-1)  # 0.5, 0.2, 0.9, 0.45, 0.4
    assert chosen_heads(mass, bins) == [int(np.argmax(local)), 3, int(np.argmin(local))] == [2, 3, 1]
    assert chosen_heads(mass[:1], bins) == [0]


@pytest.mark.parametrize("style", ["icml", "icml-column"])
def test_each_panel_draws_the_stored_values_of_the_heads_it_names(files: list[Path], style: str) -> None:
    opened = [open_bias_file(p) for p in files]
    try:
        fig = measures_page(opened, train_len=16, style=style)
        texts = [t for t, _, _ in check_print(fig, style)]
        title = fig.get_suptitle().replace("\n", " ")
        assert "T = 48 (3× the training length)" in title and "mean of 5 samples" in title, title
        assert "tiny model, 300 training steps" in title and "most local" in fig.biasviz_caption
        panels = fig.axes
        narrow = style == "icml-column"
        for k, bf in enumerate(opened):
            axes = [panels[m * 2 + k] for m in range(3)] if narrow else panels[3 * k : 3 * k + 3]
            mass = bf.summary_array("band_mass", -1)[0]
            heads = chosen_heads(mass, bf.summary.distance_bins())
            assert len(heads) == 3
            legend = [t.get_text() for t in axes[2].get_legend().get_texts()]
            assert legend == [f"head {h + 1}, {r}" for h, r in zip(heads, ("most local", "median", "least local"),
                                                                    strict=True)]  # fmt: skip
            context = bf.summary_array("context_mass", -1)[0]
            context_se = bf.summary_array("context_mass_se", -1)
            for line, band, h in zip(axes[2].lines, axes[2].collections, heads, strict=False):
                np.testing.assert_allclose(line.get_ydata(), context[h], rtol=1e-6)
                top = band.get_paths()[0].vertices[:, 1].max()
                assert np.isclose(top, (context[h] + Z95 * context_se[h]).max(), rtol=1e-6)
            bins = bf.summary.distance_bins()
            width = bins[:, 1] - bins[:, 0] + 1
            for line, h in zip(axes[1].lines, heads, strict=True):
                np.testing.assert_allclose(line.get_ydata(), mass[h] / width, rtol=1e-6)
            if bf.scheme == "rope":
                use = bf.summary_array("frequency_use", -1)
                pairs, _ = bf.summary.rotary_pairs(bf.resolve_layer(-1))
                assert use.shape[-1] == pairs + 1  # the unrotated row is left out of the pairs' lines
                want = [use[o, h, :pairs] for h in heads for o in (0, 1)]  # q then k, head by head
                assert len(axes[0].lines) == len(want)
                for line, y in zip(axes[0].lines, want, strict=True):
                    np.testing.assert_allclose(line.get_ydata(), y, rtol=1e-6)
            else:
                assert not axes[0].lines and any("No rotary pairs" in t for t in texts)
    finally:
        for f in opened:
            f.close()


def test_files_of_other_lengths_are_one_error(files: list[Path], tmp_path: Path, capsys: Any) -> None:
    other = tmp_path / "short.h5"
    ids = np.random.default_rng(4).integers(0, 97, size=(5, 32))
    biasviz.extract(small_model("alibi", n_head=4), ids, other, summary=True, device="cpu", progress=False)
    assert main([str(files[0]), str(other), "--out", str(tmp_path / "page")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error:") and "T = 32" in err[0] and "T = 48" in err[0]
    assert not list(tmp_path.glob("page*"))
    assert main([*map(str, files), "--out", str(tmp_path / "page"), "--width", "3.25"]) == 0
    assert (tmp_path / "page.pdf").stat().st_size > 0 and (tmp_path / "page.png").stat().st_size > 0


@pytest.mark.parametrize("style", ["neurips", "icml"])
def test_the_title_is_two_lines_at_a_pages_width_and_the_caption_says_the_rest(files: list[Path], style: str,
                                                                               tmp_path: Path) -> None:  # fmt: skip
    """The title says what, where and on what in at most two lines (as drawn: its height no more than two lines of
    its size take); how to read the panels, the heads, the bands and where an axis stops are in the caption, which
    ``--caption`` writes beside the figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    opened = [open_bias_file(p) for p in files]
    try:
        fig = measures_page(opened, train_len=16, style=style)
    finally:
        for f in opened:
            f.close()
    (title,) = [t for t in fig.texts if t.get_text() == fig.get_suptitle()]
    assert title.get_text().count("\n") <= 1, title.get_text()
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    box = title.get_window_extent(canvas.get_renderer())
    three = fig.text(0, 0, "Tg\nTg\nTg", fontproperties=title.get_fontproperties())  # the same default spacing
    below = three.get_window_extent(canvas.get_renderer()).height
    three.remove()
    assert box.height < below - 0.5 * title.get_fontsize() * fig.dpi / 72, (box.height, below)  # under three lines
    assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1  # inside the page's width
    text = title.get_text().replace("\n", " ")
    assert all(word in text for word in ("final", "T = 48", "mean of 5 samples", "tiny model")), text
    caption = fig.biasviz_caption
    assert caption.startswith("% written by biasviz") and "\\caption{" in caption
    for said in ("most local", "median", "least local", "$q$ (solid) and $k$ (dashed)", r"95\% interval",
                 "RoPE: scheme \\texttt{rope}", "ALiBi: scheme \\texttt{alibi}", "300 training steps"):
        assert said in caption, (said, caption)
    assert main([*map(str, files), "--out", str(tmp_path / "page"), "--train-len", "16", "--style", style, "--caption",
                 "--format", "png"]) == 0  # fmt: skip
    assert (tmp_path / "page.tex").read_text() == caption
    assert sorted(p.name for p in tmp_path.iterdir()) == ["page.png", "page.tex"]
