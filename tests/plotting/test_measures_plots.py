"""docs/position-measures.md's figures read back: ``plot --kind frequency`` (q and k norms by rotary pair, the unrotated
dims apart) and the entropy ``--kind profile`` adds on a summary, each against the file's stored values (which
tests/summaries/test_weight_measures_models.py checks against float64 math) or math of its own. The sinks figure's
95 % band: test_positional.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import biasviz
from biasviz.store.reader import open_bias_file
from tests.conftest import run_cli, small_model

Z95 = 1.959963984540054


def _summary(path: Path, scheme: str, *, samples: int = 4, seq_len: int = 40, **options: Any) -> Path:
    model = small_model(scheme, n_head=4, **options)  # 12 dims a head: 6 rotary pairs at full rotary
    ids = np.random.default_rng(11).integers(0, 97, size=(samples, seq_len))
    biasviz.extract(model, ids, path, layers=[1], summary=True, device="cpu", progress=False, resolution=10)
    return path


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_frequency_figure_draws_each_pair_of_q_and_k_and_the_unrotated_dims_apart(tmp_path: Path,
                                                                                  fraction: float) -> None:  # fmt: skip
    from biasviz.plotting.measures_plots import frequency_figure

    f = open_bias_file(_summary(tmp_path / "r.h5", "rope", scheme_options={"fraction": fraction}))
    use, se = f.summary_array("frequency_use", 1), f.summary_array("frequency_use_se", 1)
    pairs = 6 if fraction == 1.0 else 3
    assert f.summary.rotary_pairs(1) == (pairs, "half-split")
    assert use.shape[-1] == pairs + (fraction < 1)  # partial rotary: one more row, the unrotated dims together
    fig = frequency_figure(f, 1, scheme="rope")
    panels = [a for a in fig.axes if a.get_visible()]
    assert len(panels) == 4
    for h, ax in enumerate(panels):
        for o in range(2):  # q, then k
            line = ax.lines[o]
            np.testing.assert_array_equal(line.get_xdata(), np.arange(pairs))  # f = 0 first
            np.testing.assert_allclose(line.get_ydata(), use[o, h, :pairs], rtol=1e-6)
            top = max(p.vertices[:, 1].max() for p in ax.collections[o].get_paths())
            assert np.isclose(top, (use[o, h, :pairs] + Z95 * se[o, h, :pairs]).max(), rtol=1e-6)
        labels = list(ax.xaxis.get_major_formatter().format_ticks(ax.get_xticks()))
        if fraction == 1.0:
            assert not ax.containers and "unrot." not in labels
            continue
        assert "unrot." in labels
        for o, bar in enumerate(ax.containers):  # q, then k: a square and its 95 % error bar each
            point, _, (bar_line,) = bar.lines
            assert point.get_gid() == f"unrotated {'qk'[o]}"
            assert float(point.get_xdata()[0]) > pairs  # right of the dotted line at x = pairs, past every pair
            assert np.isclose(point.get_ydata()[0], use[o, h, pairs], rtol=1e-6)
            ends = bar_line.get_segments()[0][:, 1]
            want = use[o, h, pairs] + np.array([-1, 1]) * Z95 * se[o, h, pairs]
            np.testing.assert_allclose(np.sort(ends), want, rtol=1e-6)
    assert "unrotated" in fig._suptitle.get_text() if fraction < 1 else "unrotated" not in fig._suptitle.get_text()


def test_frequency_of_a_model_without_rotary_pairs_is_one_error_line(tmp_path: Path, capsys: Any) -> None:
    path = _summary(tmp_path / "a.h5", "alibi")
    code, out, err = run_cli(["plot", "--scheme", "alibi", "--input", str(path), "--kind", "frequency",
                              "--out-dir", str(tmp_path / "figs")], capsys)  # fmt: skip
    assert code != 0 and not out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and "rotary" in lines[0] and "alibi" in lines[0]
    assert not (tmp_path / "figs").exists() or not list((tmp_path / "figs").iterdir())


@pytest.mark.parametrize("kind", ["bands", "context", "frequency", "sinks"])
def test_summary_kinds_write_their_figure_and_caption(tmp_path: Path, capsys: Any, kind: str) -> None:
    path = _summary(tmp_path / "r.h5", "rope")
    code, _, err = run_cli(["plot", "--scheme", "rope", "--input", str(path), "--kind", kind, "--caption",
                            "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    caption = (tmp_path / f"rope_{kind}.tex").read_text()
    assert (tmp_path / f"rope_{kind}.pdf").stat().st_size > 0
    assert "mean of 4 samples" in caption and "95\\% interval" in caption


def test_profile_of_a_summary_adds_the_entropy_with_its_band_and_the_uniform_head(tmp_path: Path, capsys: Any,
                                                                                   figures: dict) -> None:  # fmt: skip
    path = _summary(tmp_path / "r.h5", "rope")
    code, _, err = run_cli(["plot", "--scheme", "rope", "--input", str(path), "--kind", "profile", "--caption",
                            "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    assert (tmp_path / "rope_entropy.png").is_file() and "nats" in (tmp_path / "rope_entropy.tex").read_text()
    f = open_bias_file(path)
    mean, se = f.summary_array("weights_entropy", 1)[0], f.summary_array("weights_entropy_se", 1)
    block = f.block
    assert block == 4
    fig = figures["rope_entropy"]
    for h, ax in enumerate(a for a in fig.axes if a.get_visible()):
        line, uniform = ax.lines[0], ax.lines[1]
        np.testing.assert_allclose(line.get_xdata(), np.arange(10) * block + (block - 1) / 2)  # block middles
        np.testing.assert_allclose(line.get_ydata(), mean[h], rtol=1e-6)
        top = ax.collections[0].get_paths()[0].vertices[:, 1].max()
        assert np.isclose(top, (mean[h] + Z95 * se[h]).max(), rtol=1e-6)
        # a head that spreads its weight evenly over the i + 1 keys it sees: ln(i + 1), averaged over the block
        even = [np.mean([np.log(i + 1) for i in range(b * block, (b + 1) * block)]) for b in range(10)]
        np.testing.assert_allclose(uniform.get_ydata(), even, rtol=1e-12)
        assert (line.get_ydata() <= np.asarray(even) + 1e-5).all()  # no query's entropy passes the even head's


def test_two_samples_draw_no_band_and_say_why(tmp_path: Path) -> None:
    from biasviz.plotting.measures_plots import frequency_figure

    f = open_bias_file(_summary(tmp_path / "r.h5", "rope", samples=2))
    fig = frequency_figure(f, 1, scheme="rope")
    assert all(not ax.collections for ax in fig.axes)
    assert "needs 3 samples" in fig._suptitle.get_text()


def test_a_joined_sweep_keeps_which_rows_are_rotary_pairs(tmp_path: Path) -> None:
    from biasviz.store.summary_writer import join_summary_files

    parts = [_summary(tmp_path / f"p{k}.h5", "rope", scheme_options={"fraction": 0.5}) for k in range(2)]
    out = join_summary_files(parts, tmp_path / "sweep.h5", steps=[0, 100], attrs={})
    f = open_bias_file(out)
    assert f.summary.rotary_pairs(1) == (3, "half-split")


def test_notebook_plot_and_xarray_view_of_the_measures(tmp_path: Path) -> None:
    """``biasviz.plot(path, "frequency")`` is the command's figure; ``to_xarray`` labels every docs/position-measures.md
    dataset: the bins' distances, which rows are rotary pairs, sink_keys as two variables."""
    xr = pytest.importorskip("xarray")
    path = _summary(tmp_path / "r.h5", "rope", scheme_options={"fraction": 0.5})
    f = open_bias_file(path)
    use = f.summary_array("frequency_use", 1)
    fig = biasviz.plot(path, "frequency")
    np.testing.assert_allclose(fig.axes[0].lines[1].get_ydata(), use[1, 0, :3], rtol=1e-6)  # head 1's k
    assert "rotary pair" in fig.biasviz_caption
    with biasviz.open(path) as view:
        ds = view.to_xarray()
    assert isinstance(ds, xr.Dataset)
    assert ds["frequency_use"].dims == ("operand", "head", "pair")
    assert ds["frequency_use"].attrs["rotary_pairs"] == 3 and ds["rotary"].values.tolist() == [True] * 3 + [False]
    np.testing.assert_allclose(ds["frequency_use"].sel(operand="k", head=2).values, use[1, 1], rtol=1e-6)
    bins = f.summary.distance_bins()
    assert ds["band_mass"].dims == ("stat", "head", "distance_bin")
    assert ds["distance_first"].values.tolist() == bins[:, 0].tolist()
    assert ds["distance_last"].values.tolist() == bins[:, 1].tolist()
    sinks = f.summary_array("sink_keys", 1)
    for field in ("index", "share"):
        assert ds[f"sink_keys_{field}"].dims == ("sample", "head", "rank")
        np.testing.assert_array_equal(ds[f"sink_keys_{field}"].values, sinks[field])
    assert ds["sink_min_queries"].dims == ("sample", "head")
    assert (ds["sink_min_queries"].values == -(-f.seq_len // 8)).all()  # causal: ceil(T / 8)
    for name in ("band_mass_se", "context_mass_se", "weights_entropy_se", "frequency_use_se"):
        assert name in ds


def test_every_heads_line_and_band_lie_inside_the_shared_scale(tmp_path: Path) -> None:
    """The per-head line figures (context U-curve, frequency use) share one y scale over heads: it reaches the top
    of the highest head's line and band, whichever head that is (a scale set per panel froze at the first head's top
    and cut off the lines of higher heads); and on a file's context figure, every drawn point lies inside."""
    from biasviz.plotting.measures_plots import _per_head, context_figure

    x = np.linspace(0.05, 0.95, 10)
    mean = np.full((6, 10), 0.1)
    mean[4, -1] = 0.4  # a later head reaches highest
    se = np.full((6, 10), 0.01)
    fig = _per_head(x, mean, se, "t", ylabel="y", xlabel="x", log_x=False, reference=0.1, style=None)
    lo, hi = fig.axes[0].get_ylim()
    assert lo == 0 and hi >= 0.4 + Z95 * 0.01
    f = open_bias_file(_summary(tmp_path / "r.h5", "rope", samples=4))
    panels = [a for a in context_figure(f, 1, scheme="rope").axes if a.get_visible()]
    top = panels[0].get_ylim()[1]
    assert top >= max(np.nanmax(line.get_ydata()) for ax in panels for line in ax.lines)
