"""``biasviz diagnose`` (:mod:`biasviz.cli.diagnose_cmd`): the JSON it writes, set against the diagnostics' definitions
computed with numpy (tests/summary_files.py), the names it gives files of one scheme, the figures and captions it
writes beside the JSON, and its refusals."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from biasviz.cli.diagnose_cmd import DEFINITIONS, _FileResult
from tests.cli.test_cli_summary import LAYER, H, N, R, T, files  # noqa: F401  (files: fixture)
from tests.conftest import run_cli
from tests.summary_files import cable, diagnostics, weights_of, write_full, write_summary


def test_diagnose_reads_the_stored_values(files: dict[str, Path], figures: dict[str, Any], tmp_path: Path,  # noqa: F811
                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    summary = tmp_path / "stored.h5"
    summary.write_bytes(files["summary"].read_bytes())
    stored = np.zeros(H, [("context_dependence", "f8"), ("toeplitz_residual", "f8"), ("separability_residual", "f8")])
    stored["context_dependence"] = np.arange(H) / 7  # values no recomputation from the maps could give
    stored["toeplitz_residual"] = 0.25
    stored["separability_residual"][3] = np.nan
    with h5py.File(summary, "r+") as f:
        f[f"layer_{LAYER}/diagnostics"][...] = stored
    target = tmp_path / "d.json"
    code, _, err = run_cli(["diagnose", str(summary), str(files["full"]), str(files["shared"]), "--json", str(target),
                            "--format", "png", "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    doc = json.loads(target.read_text())["schemes"]
    got = doc["cable-stored"]
    assert (got["seq_len"], got["samples"], got["summary"], got["resolution"], got["block"]) == (T, N, True, R, 5)
    assert [h["context_dependence"] for h in got["heads"]] == pytest.approx(list(np.arange(H) / 7), abs=0)
    assert {h["toeplitz_residual"] for h in got["heads"]} == {0.25}
    assert got["heads"][3]["separability_residual"] is None
    full = doc["cable-cable-full"]
    assert (full["seq_len"], full["samples"], full["summary"]) == (T, N, False) and "block" not in full
    assert [h["context_dependence"] for h in doc["alibi"]["heads"]] == [0.0] * H  # shared bias, 4 samples
    legend = [t.get_text() for t in figures["diagnostics"].legends[0].get_texts()]
    assert "cable-stored (T = 48, N = 3)" in legend and "ALiBi (T = 48, N = 4)" in legend
    assert "T = 48" in figures["cable-stored_bias_profile"].get_suptitle()


def diagnosed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """The JSON document of a diagnose run that must succeed."""
    json_path = Path(argv[argv.index("--json") + 1])
    code, _, err = run_cli(["diagnose", *argv], capsys)
    assert code == 0, err
    return json.loads(json_path.read_text())


def test_a_full_files_heads_are_the_definitions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bias = cable(3, 2, 12, seed=4)
    path = write_full(tmp_path / "c.h5", "cable", bias, weights_of(bias))
    doc = diagnosed([str(path), "--json", str(tmp_path / "d.json"), "--no-figures"], capsys)
    assert doc["definitions"] == DEFINITIONS and doc["biasviz_version"]
    got = doc["schemes"]["cable"]
    assert (got["scheme"], got["layer"], got["samples"], got["seq_len"], got["normalize"], got["summary"]) == (
        "cable", 3, 3, 12, "none", False)
    assert got["context_dependent"] is True and got["source"].endswith("c.h5")
    want = diagnostics(bias)
    assert [h["index"] for h in got["heads"]] == [0, 1] and [h["head"] for h in got["heads"]] == [1, 2]
    for h, head in enumerate(got["heads"]):
        for key in ("context_dependence", "toeplitz_residual", "separability_residual"):
            assert head[key] == pytest.approx(want[key][h], rel=1e-4), key


def test_alibi_scores_zero_and_the_layer_is_chosen(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = make_bias_file(tmp_path / "a.h5", "alibi", n=2, heads=2, t=8, layers=(1, 3))
    doc = diagnosed([str(path), "--json", str(tmp_path / "d.json"), "--no-figures"], capsys)["schemes"]["alibi"]
    assert doc["layer"] == 3  # -1: the last stored
    for head in doc["heads"]:  # the same bias for every sample, constant along each diagonal, -m i + m j
        assert head["context_dependence"] == 0.0 and head["toeplitz_residual"] == 0.0
        assert head["separability_residual"] == pytest.approx(0.0, abs=1e-6)
    doc = diagnosed([str(path), "--layer", "1", "--json", str(tmp_path / "e.json"), "--no-figures"], capsys)
    assert doc["schemes"]["alibi"]["layer"] == 1


def test_files_of_one_scheme_are_named_by_file_or_folder(tmp_path: Path, make_bias_file: Callable[..., Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    paths = []
    for where in ("x/alibi.h5", "y/alibi.h5", "y/short.h5"):
        (tmp_path / where).parent.mkdir(exist_ok=True)
        paths.append(str(make_bias_file(tmp_path / where, "alibi", n=1, heads=1, t=4)))
    doc = diagnosed([*paths, "--json", str(tmp_path / "d.json"), "--no-figures"], capsys)
    assert list(doc["schemes"]) == ["alibi-x", "alibi-y", "alibi-short"]
    (tmp_path / "z" / "x").mkdir(parents=True)
    twin = make_bias_file(tmp_path / "z" / "x" / "alibi.h5", "alibi", n=1, heads=1, t=4)
    code, _, err = run_cli(["diagnose", paths[0], str(twin), "--json", str(tmp_path / "e.json"), "--no-figures"],
                           capsys)  # fmt: skip
    assert code == 1 and "two files give the same name ('alibi-x', 'alibi-x'); rename one of them" in err
    assert not (tmp_path / "e.json").exists()


@pytest.mark.parametrize(("extra", "message"), [
    (["--dpi", "100"], "--dpi is for the figures, and --no-figures draws none; drop one or the other"),
    (["--format", "png", "--caption"], "--format, --caption are for the figures"),
])  # fmt: skip
def test_figure_options_with_no_figures_are_a_usage_error(extra: list[str], message: str, tmp_path: Path,
                                                          make_bias_file: Callable[..., Path],
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    path = make_bias_file(tmp_path / "a.h5", "alibi", n=1, heads=1, t=4)
    code, _, err = run_cli(["diagnose", str(path), "--no-figures", *extra, "--json", str(tmp_path / "d.json")], capsys)
    assert code == 2 and message in err
    assert not (tmp_path / "d.json").exists()


def test_what_holds_no_bias_or_is_a_summary_normalized_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bias = cable(2, 2, 8)
    nope = write_full(tmp_path / "nope.h5", "nope", None, weights_of(bias))
    code, out, err = run_cli(["diagnose", str(nope), "--json", str(tmp_path / "d.json"), "--no-figures"], capsys)
    assert code == 1 and out == ""
    assert f"note: skipped {nope}: scheme 'nope' adds no bias" in err
    assert err.strip().splitlines()[-1] == "Error: none of the files holds a bias; nothing to diagnose"
    summary = write_summary(tmp_path / "s.h5", bias=bias, weights=weights_of(bias), resolution=4)
    code, _, err = run_cli(["diagnose", str(summary), "--normalize", "diagonal", "--json", str(tmp_path / "d.json"),
                            "--no-figures"], capsys)  # fmt: skip
    assert code == 1 and "s.h5 is a summary file: its diagnostics were computed at extraction" in err
    assert not (tmp_path / "d.json").exists()


def test_the_figures_and_their_captions_are_written_beside_the_json(
    tmp_path: Path, make_bias_file: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    path = make_bias_file(tmp_path / "a.h5", "alibi", n=2, heads=2, t=8)
    out_dir = tmp_path / "figs"
    code, out, err = run_cli(["diagnose", str(path), "--out-dir", str(out_dir), "--format", "png", "--dpi", "50",
                              "--caption"], capsys)  # fmt: skip
    assert code == 0, err
    written = [line.removeprefix("wrote ") for line in out.splitlines()]
    assert written[0] == str(out_dir / "diagnostics.json")  # --json's default
    assert sorted(Path(w).name for w in written) == ["alibi_bias_profile.png", "alibi_bias_profile.tex",
                                                     "diagnostics.json", "diagnostics.png", "diagnostics.tex"]
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(Path(w).name for w in written)
    assert "\\caption{" in (out_dir / "alibi_bias_profile.tex").read_text()


def test_what_the_figures_say_the_numbers_were_measured_on() -> None:
    result = _FileResult(name="alibi", scheme="alibi", path=Path("data/alibi.h5"), layer=11, samples=8, seq_len=512,
                         context_dependent=False, heads=[])  # fmt: skip
    assert result.measured_on() == "T = 512, N = 8"
    result.trained = "trained 300 steps"
    assert result.measured_on() == "T = 512, N = 8, trained 300 steps"
    result.bias_only, result.trained = True, None
    assert result.measured_on() == "T = 512, bias only"
    doc = result.as_json("diagonal")
    assert (doc["normalize"], doc["summary"], doc["source"], doc["layer"]) == ("diagonal", False, "data/alibi.h5", 11)
    assert "block" not in doc and "checkpoints" not in doc and "positional" not in doc
    result.block, result.resolution, result.sweep = 16, 32, [(0, []), (50, [])]
    doc = result.as_json("none")
    assert (doc["summary"], doc["block"], doc["resolution"]) == (True, 16, 32)
    assert doc["checkpoints"] == [{"step": 0, "heads": []}, {"step": 50, "heads": []}]
