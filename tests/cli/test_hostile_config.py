"""A config that spells one option twice (``seq-len`` and ``seq_len`` in one table) is refused: one of the two
values winning in silence would run with a length the user did not mean."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import Case, run_case


def _config(text: str):  # noqa: ANN202 - a Case's prepare
    def prepare(tmp: Path, _paths: dict[str, str]) -> None:
        (tmp / "c.toml").write_text(text)

    return prepare


CASES = [
    Case("both spellings in the command's table", "extract --config {tmp}/c.toml --text {tmp}/t.txt --out {tmp}/o.h5",
         r"'seq-len' and 'seq_len' in \[extract\].*same option", code=2,
         prepare=_config('[extract]\nmodel = "gpt2"\nseq-len = 8\nseq_len = 4096\n')),
    Case("both spellings at the top level", "plot --config {tmp}/c.toml --input {tmp}/x.h5",
         r"'seq_len' and 'seq-len' in the top level.*same option", code=2,
         prepare=_config('seq_len = 8\nseq-len = 4096\n')),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=str)
def test_one_option_spelled_twice_is_refused(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old code: the later spelling won and the run went on."""
    root = tmp_path / "shared"
    root.mkdir()
    tmp = tmp_path / "case"
    tmp.mkdir()
    run_case(case, {"root": str(root)}, tmp, capsys)
