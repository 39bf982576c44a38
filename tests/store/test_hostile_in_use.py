"""A file another process holds open for writing is reported as in use, not as damaged or another format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.hostile import Case, run_case
from tests.project.test_untrusted import write_valid

HOLD = "import h5py, sys; f = h5py.File(sys.argv[1], 'a'); print('open', flush=True); sys.stdin.read()"


@pytest.mark.parametrize("command", ["info", "diagnose"])
def test_a_file_open_for_writing_is_in_use(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Old code: 'is not a readable HDF5 file (truncated or another format)'."""
    root, tmp = tmp_path / "shared", tmp_path / "case"
    root.mkdir()
    tmp.mkdir()
    path = write_valid(root / "busy.h5")
    writer = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)  # fmt: skip
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "open"
        case = Case(f"{command}: held open for writing", f"{command} {{root}}/busy.h5",
                    r"busy\.h5 is in use: another process has it open for writing", subprocess=True)  # fmt: skip
        run_case(case, {"root": str(root)}, tmp, capsys)
    finally:
        writer.communicate("", timeout=30)
