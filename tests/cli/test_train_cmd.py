"""``biasviz train`` (:mod:`biasviz.cli.train_cmd`) without training: the training loop is replaced by one that
records the settings it is given and answers with a result of the test's own, so what is checked is the command's
part: the options turned into settings, ``--scheme-options`` read as a JSON object, and the line it prints."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import biasviz.common.processes as processes
import biasviz.training.loop as loop
from tests.conftest import run_cli

LOSSES = [6.0, 5.5, 5.0, 4.5, 4.0, 3.5, 3.0, 2.5, 2.0, 1.5, 1.0, 0.5]  # the last ten average (5.0 + 0.5) / 2 = 2.75


@pytest.fixture
def trained(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Each call of the training loop: its settings, folder and keywords."""
    calls: list[dict[str, Any]] = []

    def train(settings: Any, out_dir: Path, *, force: bool = False, progress: bool = True) -> Any:
        calls.append({"settings": settings, "out": out_dir, "force": force, "progress": progress})
        return loop.TrainResult(out_dir=out_dir, losses=LOSSES, seconds=2.0, tokens=10_000)

    monkeypatch.setattr(loop, "train", train)
    monkeypatch.delenv("BIASVIZ_ATTENTION", raising=False)
    return calls


def test_the_options_become_the_settings_and_one_line_says_what_was_done(
    trained: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code, stdout, err = run_cli(["train", "--scheme", "KERPLE", "--steps", "3", "--seq-len", "16", "--batch-size", "2",
                                 "--lr", "0.01", "--seed", "5", "--device", "cpu", "--precision", "float32",
                                 "--scheme-options", '{"r": 2}', "--save-every", "2", "--corpus", "c.txt",
                                 "--tokenizer", "t.json", "--quiet", "--out", str(out)], capsys)  # fmt: skip
    assert code == 0, err
    ((call),) = trained
    s = call["settings"]
    assert (s.scheme, s.preset, s.steps, s.seq_len, s.batch_size, s.lr, s.seed) == ("kerple-log", "tiny", 3, 16, 2,
                                                                                      0.01, 5)  # fmt: skip
    assert (s.device, s.precision, s.compile, s.save_every) == ("cpu", "float32", False, 2)
    assert (s.corpus, s.tokenizer, s.scheme_options) == ("c.txt", "t.json", {"r": 2})
    assert (call["out"], call["force"], call["progress"]) == (out, False, False)
    # 10,000 tokens in 2 s; the first loss, and the mean of the last ten
    assert stdout == (f"trained kerple-log (tiny) for 3 steps in 2.0 s (5,000 tokens/s); loss 6.00 -> 2.75; "
                      f"wrote {out}\n")


def test_the_defaults(trained: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["train", "--scheme", "alibi", "--out", str(tmp_path / "run"), "--force"], capsys)
    assert code == 0, err
    s = trained[0]["settings"]
    assert (s.preset, s.steps, s.seq_len, s.batch_size, s.lr, s.seed) == ("tiny", 300, 128, 8, 2e-3, 0)
    assert (s.corpus, s.tokenizer, s.scheme_options, s.precision, s.save_every) == (None, None, {}, "auto", 0)
    assert trained[0]["force"] and trained[0]["progress"]


@pytest.mark.parametrize(("options", "message"), [
    ('{"slopes": ', "--scheme-options is not valid JSON: Expecting value"),
    ("[1, 2]", "--scheme-options must be a JSON object"),
    ('"interleaved"', "--scheme-options must be a JSON object"),
])  # fmt: skip
def test_scheme_options_that_are_no_json_object_are_a_usage_error(
    options: str, message: str, trained: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(["train", "--scheme", "alibi", "--scheme-options", options, "--out", str(tmp_path / "r")],
                             capsys)  # fmt: skip
    assert code == 2 and out == ""
    assert err.startswith("Error: ") and message in err and len(err.strip().splitlines()) == 1
    assert trained == []


@pytest.mark.parametrize("lr", ["0", "-1e-3", "nan", "inf"])
def test_a_learning_rate_that_trains_nothing_is_refused(lr: str, trained: list[dict[str, Any]], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code, _, err = run_cli(["train", "--scheme", "alibi", "--lr", lr, "--out", str(tmp_path / "r")], capsys)
    assert code == 2 and "--lr must be a positive number" in err
    assert trained == []


def test_an_existing_folder_holding_an_input_is_refused(trained: list[dict[str, Any]], tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    (tmp_path / "run").mkdir()
    corpus = tmp_path / "run" / "corpus.txt"
    corpus.write_text("text\n")
    code, _, err = run_cli(["train", "--scheme", "alibi", "--corpus", str(corpus), "--out", str(tmp_path / "run"),
                            "--force"], capsys)  # fmt: skip
    assert code == 1 and f"{tmp_path / 'run'} holds an input" in err
    assert trained == [] and corpus.read_text() == "text\n"


def test_only_the_first_process_speaks(
    trained: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    @contextlib.contextmanager
    def second(device: str) -> Iterator[tuple[Any, None]]:
        yield SimpleNamespace(main=False, rank=1, size=2), None

    monkeypatch.setattr(processes, "process_group", second)
    code, out, err = run_cli(["train", "--scheme", "alibi", "--out", str(tmp_path / "run")], capsys)
    assert code == 0, err
    assert len(trained) == 1 and out == ""
