"""One colour-scale decision for every heatmap, read back from what is drawn.

Expectations are computed here from matplotlib's own colour maps and the data written, never from biasviz's
scale objects (the rule written out in tests/plotting/colour_rule.py): a one-sign head gets a sequential map over
its own range, a head that changes sign a diverging map centred at 0 with the data's own (lopsided) limits, or
symmetric ones where a side is noise, and one such head puts the whole figure on the diverging map; both ends of
every colour bar are labelled, in one number format per figure; and a cell gets the same colour in ``biasviz
plot``'s PNG, the notebook API's figure and the explorer.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pytest

from biasviz.plotting.heatmap import head_grid
from tests.conftest import SYNTHETIC_ATTRS, run_cli, softmax_weights
from tests.explorer.test_build import page_payload, unpack
from tests.plotting.colour_rule import expected_limits, place

T = 8
LOWER = np.tril(np.ones((T, T), bool))


def _heads() -> np.ndarray:
    """(3, T, T) float32, masked NaN: head 1 one sign (<= 0), head 2 all 0, head 3 lopsided across 0."""
    d = np.subtract.outer(np.arange(T), np.arange(T)).astype(np.float64)
    heads = np.stack([-0.37 * d, 0.0 * d, 0.9 - 0.6 * d])  # head 3: 0.9 .. -3.3
    return np.where(LOWER, heads, np.nan).astype(np.float32)


def _bars(fig: mpl.figure.Figure) -> list[mpl.axes.Axes]:
    fig.canvas.draw()
    return [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]


def _shown(bar: mpl.axes.Axes) -> list[tuple[float, str]]:
    return [(float(t), label.get_text()) for t, label in zip(bar.yaxis.get_majorticklocs(),
                                                             bar.yaxis.get_ticklabels(), strict=True)]  # fmt: skip


def test_one_sign_is_sequential_unless_a_head_of_the_figure_diverges() -> None:
    """Head 3 changes sign (lopsided: both sides over a twentieth of the range), so the figure is drawn on one
    diverging map: head 1 (one sign) and head 2 (zeros) from minus to plus their largest magnitude."""
    heads = _heads()
    bars = _bars(head_grid(heads, kind="bias", max_cells=T))
    cells = [h[LOWER].astype(np.float64) for h in heads]
    want = expected_limits(cells)
    assert want == [(cells[0].min(), -cells[0].min(), True), (-1.0, 1.0, True), (cells[2].min(), cells[2].max(), True)]
    for bar, (lo, hi, _) in zip(bars, want, strict=True):
        assert bar.get_ylim() == pytest.approx((lo, hi), abs=1e-6)  # the bar spans exactly the limits
        shown = _shown(bar)
        assert shown[0][0] == pytest.approx(lo, abs=1e-6) and shown[-1][0] == pytest.approx(hi, abs=1e-6)
        assert shown[0][1] and shown[-1][1]  # both ends carry a label
        assert any(v == 0.0 and label == "0.0" for v, label in shown), shown  # every diverging bar labels its 0
    panels = [ax.get_images()[0] for ax in bar.figure.axes if ax.get_images()]
    assert [im.get_cmap().name for im in panels] == ["RdBu_r"] * 3  # one colour family per figure
    alone = _bars(head_grid(heads[:2], kind="bias", max_cells=T))  # no head diverges: sequential, as before
    assert [v for b in alone for v in b.get_ylim()] == pytest.approx([cells[0].min(), 0.0, 0.0, 1.0], abs=1e-6)


def test_a_side_under_a_twentieth_of_the_range_gives_symmetric_limits() -> None:
    """-0.93 beside +0.02: the +0.02 stays pale (the map's 0.51, not its end) instead of as saturated as -0.93."""
    d = np.subtract.outer(np.arange(T), np.arange(T)).astype(np.float64)
    head = np.where(LOWER, 0.02 - (0.95 / 7) * d, np.nan)  # 0.02 .. -0.93
    fig = head_grid(head[None], kind="bias", max_cells=T)
    (bar,) = _bars(fig)
    (lo, hi, centred), = expected_limits([head[LOWER]])
    assert centred and (lo, hi) == pytest.approx((-0.93, 0.93)) and bar.get_ylim() == pytest.approx((lo, hi))
    norm = [ax for ax in fig.axes if ax.get_images()][0].get_images()[0].norm
    assert float(norm(0.02)) == pytest.approx(place(0.02, lo, hi, True)) == pytest.approx(0.5 + 0.01 / 0.93)


def test_one_number_format_for_every_colour_bar_of_a_figure() -> None:
    d = np.subtract.outer(np.arange(16), np.arange(16)).astype(np.float64)
    data = np.stack([-0.25 * d, -d / 15.0, -0.006 * d + 0.03])  # -3.75..0, -1..0, -0.06..0.03 (diverging)
    bars = _bars(head_grid(data, kind="bias", style="icml-column"))
    decimals = set()
    for bar in bars:
        shown = _shown(bar)
        lo, hi = bar.get_ylim()
        assert shown[0][0] == pytest.approx(lo) and shown[-1][0] == pytest.approx(hi)  # both ends labelled
        for value, label in shown:
            assert label and "-" not in label and label not in ("−0", "−0.0", "−0.00", "−0.000")
            number = float(label.replace("\N{MINUS SIGN}", "-"))
            places = len(label.split(".")[1]) if "." in label else 0
            decimals.add(places)
            assert number == pytest.approx(value, abs=0.5 * 10.0**-places + 1e-12)
        positions = sorted(v for v, _ in shown)
        assert min(np.diff(positions)) > 0.15 * (hi - lo)  # labels never collide
    assert len(decimals) == 1 and decimals != {0}  # one format: the finest bar (-0.06 .. 0.03) sets every label's


def _write(path: Path, bias: np.ndarray) -> Path:
    from biasviz.store import BiasFileWriter

    b = bias[None]
    meta = {**SYNTHETIC_ATTRS, "scheme": "custom", "context_dependent": False}
    with BiasFileWriter(path, attrs=meta, n_samples=1, n_heads=b.shape[1], seq_len=T, layers=[0], has_bias=True,
                        force=True) as writer:  # fmt: skip
        writer.write_batch(np.zeros((1, T), np.int32), weights={0: softmax_weights(b)}, bias={0: b})
    return path


def _expected(heads: np.ndarray, h: int, i: int, j: int) -> np.ndarray:
    """The colour matplotlib's own map gives cell (i, j) of head h under the rules (colour_rule), 0..1 RGB."""
    lo, hi, centred = expected_limits([m[LOWER] for m in heads])[h]
    x = place(float(heads[h, i, j]), lo, hi, centred)
    return np.asarray(mpl.colormaps["RdBu_r" if centred else "viridis"](x)[:3])


def _png_cell(png: np.ndarray, fig: mpl.figure.Figure, dpi: int, h: int, i: int, j: int) -> np.ndarray:
    """The pixel at the centre of cell (i, j) of head h's panel in a PNG of ``fig`` saved at ``dpi``."""
    ax = [a for a in fig.axes if a.get_images()][h]
    x, y = ax.transData.transform((j, i)) * dpi / fig.dpi
    return png[int(png.shape[0] - y), int(x), :3]


def test_a_cell_has_one_colour_in_plot_the_notebook_and_the_explorer(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    import biasviz

    heads = _heads()
    src = _write(tmp_path / "custom.h5", heads)
    dpi = 100
    code, _, err = run_cli(["plot", "--input", str(src), "--scheme", "custom", "--out-dir", str(tmp_path / "f"),
                            "--format", "png", "--dpi", str(dpi)], capsys)  # fmt: skip
    assert code == 0, err
    (written,) = (tmp_path / "f").glob("*_bias.png")
    plot_png = mpl.image.imread(written)
    fig = biasviz.plot(src, dpi=dpi)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    notebook_png = mpl.image.imread(io.BytesIO(buffer.getvalue()))
    payload = page_payload(biasviz.explore(src, kind="bias").html)
    (key,) = payload["sets"]
    for h, (i, j) in ((0, (6, 1)), (2, (7, 0)), (2, (1, 0)), (2, (5, 4))):
        want = _expected(heads, h, i, j)
        assert np.abs(_png_cell(plot_png, fig, dpi, h, i, j) - want).max() <= 1.5 / 255
        assert np.abs(_png_cell(notebook_png, fig, dpi, h, i, j) - want).max() <= 1.5 / 255
        # the page: its scale and colour table, and the cell's value as the page decodes it (core.js, draw.js)
        lo, hi, name, *tag = payload["sets"][key]["scale"]["head"][h]
        table = np.frombuffer(base64.b64decode(payload["cmaps"][name]), np.uint8).reshape(256, 3)
        v = float(unpack(payload["sets"][key]["heads"][h]["levels"][0])[i, j])
        frac = (0.5 * (v - lo) / -lo if v < 0 else 0.5 + 0.5 * v / hi) if tag == ["centred"] else (v - lo) / (hi - lo)
        rgb = table[min(255, max(0, int(np.floor(frac * 256))))] / 255
        assert np.abs(rgb - want).max() <= 1.5 / 255, (h, i, j)


def test_a_head_of_rounding_noise_is_drawn_as_0_not_as_a_diverging_bar() -> None:
    """A head whose values are all about 1e-9 (FIRE at initialisation) changes sign only by rounding: it gets the
    all-zero scale (0 to 1, sequential), and the figure's labels keep the other heads' format (no six decimals)."""
    d = np.subtract.outer(np.arange(T), np.arange(T)).astype(np.float64)
    data = np.stack([-0.25 * d, 1e-9 * np.sin(d)])
    fig = head_grid(data, kind="bias", max_cells=T)
    noise, first = _bars(fig)[1], _bars(fig)[0]
    assert noise.get_ylim() == pytest.approx((0.0, 1.0))
    panel = [ax.get_images()[0] for ax in fig.axes if ax.get_images()][1]
    assert panel.get_cmap().name == "viridis"
    assert all(len(label.split(".")[-1]) <= 2 for _, label in _shown(first))
