"""`plot`, `diagnose` and `explore` on summary files (docs/hdf5.md, 'Summary files') and shared-bias files
(`info` on them, and diagnose's stored values: tests/cli/test_info_cmd.py, tests/cli/test_diagnose_cmd.py).

Figures are caught on their way to disk (``save_figure`` wrapped) and their drawn artists compared with
the file's data; the files are written with h5py (tests/summary_files.py), independently of biasviz's writer.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from biasviz.explorer.build import build_page_data
from biasviz.store import open_bias_file
from tests.conftest import run_cli
from tests.explorer.test_build import page_payload, unpack
from tests.summary_files import alibi, cable, weights_of, write_full, write_summary

N, H, T, R = 3, 12, 48, 10  # blocks of 5 positions, 10 per axis
LAYER = 3


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("summary")
    b = cable(N, H, T)
    a = alibi(4, H, T)
    return {
        "summary": write_summary(d / "cable.h5", bias=b, weights=weights_of(b), resolution=R),
        "exact": write_summary(d / "cable-exact.h5", bias=b, weights=weights_of(b), resolution=1024),
        "full": write_full(d / "cable-full.h5", "cable", b, weights_of(b)),
        "shared": write_full(d / "alibi.h5", "alibi", a[:1], weights_of(cable(4, H, T)), shared=True),
        "sweep": write_summary(d / "sweep.h5", bias=b, weights=weights_of(b), resolution=R, steps=[0, 50, 100]),
    }


def panels(fig: Any) -> list[Any]:
    return [ax for ax in fig.axes if ax.get_images()]


def test_plot_draws_the_mean_map_at_its_positions(files: dict[str, Path], figures: dict[str, Any], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, out, err = run_cli(["plot", "--scheme", "cable", "--input", str(files["summary"]), "--kind", "all",
                              "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cable_bias.pdf", "cable_bias.png", "cable_weights.pdf",
                                                          "cable_weights.png"]  # fmt: skip
    with open_bias_file(files["summary"]) as f:
        maps = {k: f.summary_map(f"{k}_mean") for k in ("bias", "weights")}
    for kind, fig in (("bias", figures["cable_bias"]), ("weights", figures["cable_weights"])):
        axes = panels(fig)
        assert [ax.get_title() for ax in axes] == [f"Head {h}" for h in range(1, 13)]
        title = " ".join(fig.get_suptitle().split())  # one wording in every figure kind (titles.figure_title)
        assert title.startswith(f"CABLE {kind}: final layer, 4 of 4; T = {T}; mean of 3 samples; block means of 5 × 5")
        for h, ax in enumerate(axes):
            im = ax.get_images()[0]
            assert im.get_extent() == [-0.5, 49.5, 49.5, -0.5]  # 10 blocks of 5 positions
            np.testing.assert_array_equal(ax.get_xticks(), [0, 10, 20, 30, 40])  # positions, not block indices
            assert ax.get_xlim() == (-0.5, T - 0.5) and ax.yaxis_inverted()
            np.testing.assert_array_equal(np.ma.filled(im.get_array(), np.nan), maps[kind][h])
    assert b"summary in blocks of 5 positions" in (tmp_path / "cable_bias.pdf").read_bytes()


def test_plot_std_and_profile_of_a_summary(files: dict[str, Path], figures: dict[str, Any], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    for kind in ("std", "profile"):
        code, _, err = run_cli(["plot", "--scheme", "cable", "--input", str(files["summary"]), "--kind", kind,
                                "--format", "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
        assert code == 0, err
    with open_bias_file(files["summary"]) as f:
        std = f.summary_map("weights_std")
        mean, spread = f.profile("bias")
    fig = figures["cable_weights_std"]
    assert "standard deviation over 3 samples" in fig.get_suptitle()
    for h, ax in enumerate(panels(fig)):
        im = ax.get_images()[0]
        np.testing.assert_array_equal(np.ma.filled(im.get_array(), np.nan), std[h])
        assert im.norm.vmin == 0.0
    profile = figures["cable_bias_profile"]
    assert " ".join(profile.get_suptitle().split()).startswith(
        f"CABLE bias by distance: final layer, 4 of 4; T = {T}; mean ± 1 std over 3 samples")
    for h, ax in enumerate(a for a in profile.axes if a.get_visible()):
        np.testing.assert_allclose(ax.lines[0].get_ydata(), mean[h])
    assert {p.name for p in tmp_path.iterdir()} == {"cable_bias_std.png", "cable_weights_std.png",
                                                    "cable_bias_profile.png", "cable_weights_profile.png"}  # fmt: skip


def test_profile_of_a_full_file_is_numpys_per_diagonal_mean_and_std(
    files: dict[str, Path], figures: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["plot", "--scheme", "cable", "--input", str(files["full"]), "--kind", "profile",
                            "--format", "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    with h5py.File(files["full"]) as f:
        bias = f[f"layer_{LAYER}/bias"][()].astype(np.float64)
    fig = figures["cable_bias_profile"]
    for h, ax in enumerate(a for a in fig.axes if a.get_visible()):
        diagonals = [np.concatenate([np.diagonal(bias[s, h], -d) for s in range(N)]) for d in range(T)]
        mean, std = np.array([x.mean() for x in diagonals]), np.array([x.std() for x in diagonals])
        np.testing.assert_allclose(ax.lines[0].get_ydata(), mean, rtol=1e-6, atol=1e-6)
        band = ax.collections[0].get_paths()[0].vertices  # fill_between: the lower edge, then the upper
        top = {round(x): y for x, y in band if y >= np.interp(x, np.arange(T), mean) + 1e-9}
        np.testing.assert_allclose([top[d] for d in range(1, T)], (mean + std)[1:], rtol=1e-5, atol=1e-5)


def test_a_per_sample_request_on_a_summary_is_one_error(files: dict[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "figs"
    for extra in (["--sample", "1"], ["--sample", "0", "--kind", "weights"], ["--normalize", "diagonal"]):
        code, stdout, err = run_cli(["plot", "--scheme", "cable", "--input", str(files["summary"]), *extra,
                                     "--out-dir", str(out)], capsys)  # fmt: skip
        assert code == 1 and err.startswith("Error:") and len(err.strip().splitlines()) == 1, err
        assert "summary" in err and "without --summary" in err and "Traceback" not in err
        assert not out.exists() and not stdout
    code, _, err = run_cli(["plot", "--scheme", "cable", "--input", str(files["summary"]), "--sample", "mean",
                            "--format", "png", "--out-dir", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli(["plot", "--scheme", "cable", "--input", str(files["full"]), "--kind", "std",
                            "--sample", "2", "--out-dir", str(out)], capsys)  # fmt: skip
    assert code == 2 and err.startswith("Error:")


def test_diagnose_and_dynamics_of_a_summary_sweep(files: dict[str, Path], figures: dict[str, Any], tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, _, err = run_cli(["diagnose", str(files["sweep"]), "--json", str(tmp_path / "d.json"), "--no-figures"],
                           capsys)  # fmt: skip
    assert code == 0, err
    doc = json.loads((tmp_path / "d.json").read_text())["schemes"]["cable"]
    assert [c["step"] for c in doc["checkpoints"]] == [0, 50, 100]
    code, _, err = run_cli(["plot", "--scheme", "cable", "--input", str(files["sweep"]), "--kind", "dynamics",
                            "--format", "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    with open_bias_file(files["sweep"]) as f:
        mean, _ = f.profile("bias")
    first = next(a for a in figures["cable_dynamics"].axes if a.get_title() == "Head 1")
    np.testing.assert_allclose(first.lines[-1].get_ydata(), mean[0])


def test_the_explorer_shows_a_summarys_block_means(files: dict[str, Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "page.html"
    code, _, err = run_cli(["explore", str(files["summary"]), "--out", str(out)], capsys)
    assert code == 0, err
    html = out.read_text()
    payload = page_payload(html)
    assert payload["summary"] == {"block": 5, "samples": N, "bias_only": False}
    assert sorted(payload["sets"]) == ["A|3|bias|mean", "A|3|weights|mean"]
    assert [s["samples"] for s in payload["sources"]] == [["mean"]]
    assert html.count('<canvas data-head="') == H and 'id="readout"' in html
    assert "mean over 3 samples over blocks of 5 x 5 positions" in html
    with open_bias_file(files["summary"]) as f:
        for kind in ("bias", "weights"):
            maps, (mean, std) = f.summary_map(f"{kind}_mean"), f.profile(kind)
            for h, head in enumerate(payload["sets"][f"A|3|{kind}|mean"]["heads"]):
                level = head["levels"][0]
                assert (level["f"], level["n"]) == (5, 10)  # each cell a block of 5 positions
                np.testing.assert_array_equal(unpack(level), maps[h])
                for stat, values in (("mean", mean), ("std", std)):
                    decoded = np.frombuffer(base64.b64decode(head["profile"][stat]), "<f4")
                    np.testing.assert_array_equal(decoded, values[h].astype(np.float32))


def test_the_explorer_reduces_a_long_summary_by_cells(tmp_path: Path) -> None:
    w = weights_of(alibi(2, 2, 600))
    src = write_summary(tmp_path / "long.h5", "nope", weights=w, resolution=600)  # no bias: no slow diagnostics
    payload = build_page_data([src], kind="weights", max_mb=20).payload
    levels = payload["sets"]["A|3|weights|mean"]["heads"][1]["levels"]
    assert [lv["f"] for lv in levels] == [1, 4]  # exact detail, then a 150-cell overview
    with open_bias_file(src) as f:
        exact = f.summary_map("weights_mean")[1]
    np.testing.assert_array_equal(unpack(levels[0]), exact)
    overview = unpack(levels[1])
    # the overview's diagonal block averages only its causal cells
    np.testing.assert_allclose(overview[0, 0], np.nanmean(exact[:4, :4]), rtol=1e-3)


def test_a_summary_and_a_full_file_are_not_compared(files: dict[str, Path]) -> None:
    from biasviz.common.errors import BiasvizError

    with pytest.raises(BiasvizError, match="cannot be compared block by block"):
        build_page_data([files["full"], files["summary"]])
    payload = build_page_data([files["summary"], files["summary"]], kind="bias").payload
    # A - B travels as no matrix (the page subtracts B's cells from A's): here every cell of it is 0
    assert payload["sets"]["D|3|bias|mean"]["heads"][0]["levels"] == []
    a, b = (unpack(payload["sets"][f"{s}|3|bias|mean"]["heads"][0]["levels"][0]) for s in "AB")
    assert not (a - b)[np.tril_indices(10)].any()
    # every difference 0: one sign, so the sequential scale of an all-zero head (0 to 1), as every heatmap draws it
    assert payload["sets"]["D|3|bias|mean"]["scale"]["head"][0][:3] == [0.0, 1.0, "viridis"]
