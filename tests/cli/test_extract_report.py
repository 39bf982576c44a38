"""What ``biasviz extract`` says once its file is written (:mod:`biasviz.cli.extract_report`): the ``wrote ...`` line
worked out by hand for each kind of extraction, the summary's blocks, the list of what a file holds, and the notes on
what a summary lacks (read back from a file written with h5py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest

from biasviz.cli.extract_report import blocks, listed, report, summarised


@pytest.mark.parametrize(("seq_len", "resolution", "text"), [
    (512, None, "512 x 512 cells"),  # up to 1024 positions: every cell
    (1024, None, "1024 x 1024 cells"),
    (16384, None, "1024 x 1024 blocks of 16 positions"),
    (1000, 300, "250 x 250 blocks of 4 positions"),  # ceil(1000 / 300) = 4
    (10, 4, "4 x 4 blocks of 3 positions"),  # ceil(10 / 4) = 3, ceil(10 / 3) = 4 blocks
    (10, 10, "10 x 10 cells"),
    (10, 100, "10 x 10 cells"),
])  # fmt: skip
def test_the_blocks_of_a_summary(seq_len: int, resolution: int | None, text: str) -> None:
    assert blocks(seq_len, resolution) == text


def test_a_list_of_what_is_held() -> None:
    assert listed(["bias"], "alibi", True) == "bias"
    assert listed(["bias", "weights"], "alibi", True) == "bias and weights"
    assert listed(["bias", "weights", "scores"], "alibi", True) == "bias, weights and scores"
    assert listed(["weights"], "rope", False) == "weights (scheme 'rope' adds no bias)"


def request(**changes: object) -> SimpleNamespace:
    return SimpleNamespace(**{"bias_only": False, "resolution": None, "seq_len": 64, "dtype": "float16",
                              "kinds": None, "summary": False, **changes})  # fmt: skip


def result(path: Path, **changes: object) -> SimpleNamespace:
    return SimpleNamespace(**{"path": path, "layers": [3], "samples": 8, "seq_len": 64, "has_bias": True,
                              "bytes": 12_345_678, "seconds": 4.04, **changes})  # fmt: skip


ADAPTER = SimpleNamespace(n_heads=12, scheme="alibi")
ONE = SimpleNamespace(size=1)


def said(capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    got = capsys.readouterr()
    return got.out, got.err


def test_a_full_file(capsys: pytest.CaptureFixture[str]) -> None:
    report(request(), ADAPTER, result(Path("data/alibi.h5"), layers=[0, 11]), ONE, None)
    assert said(capsys) == ("wrote data/alibi.h5: 8 samples x 12 heads x 64 x 64, layers 0, 11: bias and weights, "
                            "float16, 12.3 MB in 4.0 s\n", "")  # fmt: skip
    report(request(), SimpleNamespace(n_heads=4, scheme="nope"), result(Path("n.h5"), has_bias=False),
           SimpleNamespace(size=4), None)  # fmt: skip
    assert said(capsys)[0] == ("wrote n.h5: 8 samples x 4 heads x 64 x 64, layer 3 weights (scheme 'nope' adds no "
                               "bias), float16, 4 processes, 12.3 MB in 4.0 s\n")  # fmt: skip
    report(request(), ADAPTER, result(Path("one.h5"), samples=1), ONE, None)
    assert said(capsys)[0].startswith("wrote one.h5: 1 sample x 12 heads x 64 x 64, layer 3")
    report(request(kinds=("weights", "scores")), ADAPTER, result(Path("s.h5")), ONE, None)
    assert "layer 3 weights and scores, float16" in said(capsys)[0]  # bias not asked for: nothing said of it


def test_the_bias_alone(capsys: pytest.CaptureFixture[str]) -> None:
    report(request(bias_only=True, dtype="float32"), ADAPTER, result(Path("b.h5"), layers=[1, 2]), ONE, None)
    assert said(capsys)[0] == ("wrote b.h5: the bias of layers 1, 2, 12 heads x 64 x 64, float32, no text "
                               "(--bias-only), 12.3 MB in 4.0 s\n")  # fmt: skip
    report(request(bias_only=True, resolution=16), ADAPTER, result(Path("b.h5")), ONE, None)
    assert "12 heads x 16 x 16 blocks of 4 positions, no text" in said(capsys)[0]


def test_a_sweeps_steps_are_shown_eight_at_most(capsys: pytest.CaptureFixture[str]) -> None:
    few = SimpleNamespace(chosen=[SimpleNamespace(step=s) for s in (0, 100, 200)])
    report(request(), ADAPTER, result(Path("w.h5")), ONE, few)
    assert ", 3 checkpoints (steps 0, 100, 200), 12.3 MB" in said(capsys)[0]
    many = SimpleNamespace(chosen=[SimpleNamespace(step=10 * s) for s in range(12)])
    report(request(), ADAPTER, result(Path("w.h5")), SimpleNamespace(size=2), many)
    assert ", 2 processes, 12 checkpoints (steps 0, 10, 20, 30, ..., 90, 100, 110), " in said(capsys)[0]


def summary_file(path: Path, names: list[str]) -> Path:
    with h5py.File(path, "w") as f:
        for name in names:
            f[f"layer_2/{name}"] = np.zeros(1)
    return path


def test_a_summary_says_what_it_holds_as_read_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = summary_file(tmp_path / "s.h5", ["bias_mean", "weights_mean", "positional_mean", "weights_profile"])
    report(request(summary=True, resolution=32), ADAPTER, result(path, layers=[2], samples=5), ONE, None)
    assert said(capsys) == (f"wrote {path}: summary of 5 samples: 12 heads x 32 x 32 blocks of 2 positions, layer 2 "
                            "bias, weights and positional logits, float32, 12.3 MB in 4.0 s\n", "")  # fmt: skip
    one = summary_file(tmp_path / "one.h5", ["weights_mean"])
    report(request(summary=True), SimpleNamespace(n_heads=2, scheme="rope"), result(one, layers=[2], samples=1),
           ONE, None)  # fmt: skip
    out, err = said(capsys)
    assert out.startswith(f"wrote {one}: summary of 1 sample: 2 heads x 64 x 64 cells, layer 2 weights (scheme 'rope' "
                          "adds no bias), float32")  # fmt: skip
    assert err.startswith("note: no positional logits P: P needs two samples or more") and "--samples 2" in err


@pytest.mark.parametrize(("names", "held", "note"), [
    (["weights_mean", "band_mass"], "weights and position measures", "no rotary frequency measures"),
    (["weights_mean", "band_mass", "frequency_use"], "weights, position measures and rotary frequencies",
     "no positional_frequency: it needs two samples"),
    (["weights_mean", "band_mass", "frequency_use", "positional_frequency"],
     "weights, position measures and rotary frequencies", None),
    (["scores_mean"], "scores", None),
])  # fmt: skip
def test_the_measures_a_summary_lacks_are_noted(tmp_path: Path, capsys: pytest.CaptureFixture[str], names: list[str],
                                                held: str, note: str | None) -> None:  # fmt: skip
    text = summarised(summary_file(tmp_path / "s.h5", names), 2, "rope")
    assert text == f"{held} (scheme 'rope' adds no bias)"
    err = said(capsys)[1]
    assert (note in err and err.startswith("note: ")) if note else err == ""
