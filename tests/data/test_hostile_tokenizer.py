"""A tokenizer.json the Rust library panics on (a normalizer replacing the empty matches of ``\\b``) is one ``Error:``
line naming the tokenizer, not the library's panic, its backtrace and a PanicException traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.hostile import Case, checkpoint, run_case


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return checkpoint(tmp_path_factory.mktemp("tok"))


def _panicking(tmp: Path, paths: dict[str, str]) -> None:
    shutil.copytree(paths["ck"], tmp / "ck")
    doc = json.loads((tmp / "ck" / "tokenizer.json").read_text())
    doc["normalizer"] = {"type": "Replace", "pattern": {"Regex": "\\b"}, "content": "xx"}
    (tmp / "ck" / "tokenizer.json").write_text(json.dumps(doc))


CASE = Case("a normalizer the library panics on", "extract --model {tmp}/ck --text {text} --seq-len 8 --samples 1 "
            "--quiet --out {tmp}/o.h5", r"the tokenizer of .* failed on the text \(index out of bounds",
            prepare=_panicking, subprocess=True)  # fmt: skip


def test_a_tokenizer_that_panics_is_one_error_line(paths: dict[str, str], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: the Rust panic message, its backtrace and a PanicException traceback."""
    run_case(CASE, paths, tmp_path, capsys)
