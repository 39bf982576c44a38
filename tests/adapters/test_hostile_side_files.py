"""A checkpoint's side files (training.json, tokenizer_config.json and friends) are read only when they are regular
files of a sane size: a FIFO would hang ``extract`` forever, a link to /dev/zero fill the memory."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from biasviz.common.errors import BiasvizError
from tests.hostile import EXTRACT, Case, checkpoint, limited, run_case


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return checkpoint(tmp_path_factory.mktemp("side"))


def _checkpoint_with(name: str, make: Callable[[Path], None]) -> Callable[[Path, dict[str, str]], None]:
    def prepare(tmp: Path, paths: dict[str, str]) -> None:
        shutil.copytree(paths["ck"], tmp / "ck")
        (tmp / "ck" / name).unlink(missing_ok=True)
        make(tmp / "ck" / name)

    return prepare


def _zero(p: Path) -> None:
    p.symlink_to("/dev/zero")


CASES = [
    Case("training.json a FIFO", EXTRACT, r"training\.json is not a regular file but a FIFO",
         prepare=_checkpoint_with("training.json", os.mkfifo), subprocess=True),
    Case("training.json a link to /dev/zero", EXTRACT, r"training\.json is not a regular file but a character device",
         prepare=_checkpoint_with("training.json", _zero), subprocess=True),
    Case("tokenizer_config.json a link to /dev/zero", EXTRACT, r"tokenizer_config\.json is not a regular file",
         prepare=_checkpoint_with("tokenizer_config.json", _zero), subprocess=True),
    Case("generation_config.json a FIFO", EXTRACT, r"generation_config\.json is not a regular file but a FIFO",
         prepare=_checkpoint_with("generation_config.json", os.mkfifo), subprocess=True),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_side_files_that_never_end_are_refused(case: Case, paths: dict[str, str], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """Old code: training.json was read whole as found: a hang on the FIFO, all the memory from /dev/zero."""
    run_case(case, paths, tmp_path, capsys)


def test_a_huge_side_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """A sparse training.json past the bound: refused from its size, nothing allocated."""
    from biasviz.common.inputs import SIDE_FILE_BYTES, check_side_files, read_text

    big = tmp_path / "training.json"
    with big.open("wb") as f:
        f.truncate(SIDE_FILE_BYTES + 1)
    with limited(), pytest.raises(BiasvizError, match=r"training\.json is [\d,]+ bytes.*at most"):
        check_side_files(tmp_path)
    with limited(), pytest.raises(BiasvizError, match=r"is [\d,]+ bytes.*at most"):
        read_text(big, "training.json")
