"""A file says how biasviz trained the model it came from (the checkpoint's training.json), and every figure
drawn from it says so: a tiny run's figure must not pass for a paper's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import h5py
import pytest

from biasviz.plotting.titles import trained_note
from biasviz.training.provenance import how_trained
from tests.conftest import run_cli

TEXT = "def f(x):\n    return [x * i for i in range(10)]  # a line of code\n" * 200


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from biasviz.cli import main

    d = tmp_path_factory.mktemp("trained")
    (d / "text.txt").write_text(TEXT)
    extract = ["extract", "--model", str(d / "run"), "--text", str(d / "text.txt"), "--seq-len", "16", "--samples",
               "2", "--device", "cpu", "--quiet"]  # fmt: skip
    for args in (["train", "--scheme", "alibi", "--steps", "3", "--seq-len", "16", "--batch-size", "2", "--corpus",
                  str(d / "text.txt"), "--device", "cpu", "--quiet", "--out", str(d / "run")],
                 [*extract, "--out", str(d / "full.h5")],
                 [*extract, "--summary", "--out", str(d / "sum.h5")]):  # fmt: skip
        try:
            main(args)
        except SystemExit as exc:
            assert not exc.code, args
    return {"run": d / "run", "full": d / "full.h5", "summary": d / "sum.h5"}


def test_the_file_records_the_training_runs_preset_steps_and_window(trained: dict[str, Path]) -> None:
    log = json.loads((trained["run"] / "training.json").read_text())
    for name in ("full", "summary"):
        with h5py.File(trained[name]) as f:
            got = json.loads(f.attrs["training"])
        assert got["preset"] == log["settings"]["preset"] == "tiny"
        assert got["steps"] == log["step"] == 3 and got["seq_len"] == log["settings"]["seq_len"] == 16


@pytest.mark.parametrize("doc", ["", "not json", "[1, 2]", '{"preset": "tiny", "steps": "3", "seq_len": 16}',
                                 '{"preset": 5, "steps": 3, "seq_len": 16}', '{"settings": 1}'])  # fmt: skip
def test_a_training_record_that_does_not_say_is_no_note(tmp_path: Path, doc: str) -> None:
    (tmp_path / "training.json").write_text(doc)
    assert how_trained(tmp_path) is None
    assert trained_note(doc) is None
    assert how_trained(tmp_path / "absent") is None


@pytest.mark.parametrize(("name", "args", "stem"), [
    ("full", ["--kind", "bias"], "alibi_bias"),
    ("full", ["--kind", "weights"], "alibi_weights"),
    ("summary", ["--kind", "profile"], "alibi_bias_profile"),
])  # fmt: skip
def test_every_figure_of_a_trained_run_says_how_it_was_trained(trained: dict[str, Path], tmp_path: Path, name: str,
                                                               args: list[str], stem: str,
                                                               capsys: pytest.CaptureFixture[str],
                                                               figures: dict[str, Any]) -> None:  # fmt: skip
    code, _, err = run_cli(["plot", "--scheme", "alibi", "--input", str(trained[name]), *args, "--format", "png",
                            "--out-dir", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0, err
    title = " ".join(figures[stem].get_suptitle().split())  # wrapped to the figure's width
    assert title.endswith("tiny model, 3 training steps on 16-token windows"), title


def test_the_diagnostics_figure_says_how_it_was_trained(trained: dict[str, Path], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str],
                                                        figures: dict[str, Any]) -> None:  # fmt: skip
    code, _, err = run_cli(["diagnose", str(trained["full"]), "--out-dir", str(tmp_path), "--format", "png"], capsys)
    assert code == 0, err
    assert "tiny model, 3 training steps on 16-token windows" in " ".join(figures["diagnostics"].get_suptitle().split())
    # the profile figure diagnose draws too: how trained, and that its ±std band has width 0 (ALiBi: every diagonal
    # constant, every sample measured equal), rather than a band too thin to see
    profile = " ".join(figures["alibi_bias_profile"].get_suptitle().split())
    assert profile.endswith("; std 0 at every distance; tiny model, 3 training steps on 16-token windows"), profile


def test_a_sweep_records_the_steps_of_every_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "text.txt").write_text(TEXT)
    code, _, err = run_cli(["train", "--scheme", "alibi", "--steps", "4", "--seq-len", "16", "--batch-size", "2",
                            "--save-every", "2", "--corpus", str(tmp_path / "text.txt"), "--device", "cpu", "--quiet",
                            "--out", str(tmp_path / "run")], capsys)  # fmt: skip
    assert code == 0, err
    code, _, err = run_cli(["extract", "--model", str(tmp_path / "run"), "--checkpoints", "all", "--text",
                            str(tmp_path / "text.txt"), "--seq-len", "16", "--samples", "2", "--device", "cpu",
                            "--quiet", "--out", str(tmp_path / "sweep.h5")], capsys)  # fmt: skip
    assert code == 0, err
    with h5py.File(tmp_path / "sweep.h5") as f:
        steps = [int(x) for x in f["checkpoint"][()]]
        got = json.loads(f.attrs["training"])
    each = [json.loads((tmp_path / "run" / f"checkpoint-{s}" / "training.json").read_text())["step"] for s in steps]
    assert got["steps"] == each == steps and got["preset"] == "tiny"
    assert trained_note(json.dumps(got)) == (f"tiny model, checkpoints of {min(steps)} to {max(steps)} training "
                                             "steps on 16-token windows")  # fmt: skip
