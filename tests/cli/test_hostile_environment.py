"""Bad settings from the environment and the config file are one ``Error:`` line, not a traceback: ``MPLBACKEND``
naming no backend, a TOML config nested 100,000 levels deep."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hostile import Case, run_case
from tests.project.test_untrusted import write_valid


def _good(tmp: Path, _paths: dict[str, str]) -> None:
    write_valid(tmp / "x.h5")


def _deep(tmp: Path, _paths: dict[str, str]) -> None:
    (tmp / "c.toml").write_text("dpi = " + "[" * 100_000 + "]" * 100_000 + "\n")


@pytest.mark.parametrize("command", ["plot --scheme alibi --input {tmp}/x.h5 --out-dir {tmp}/f",
                                     "diagnose {tmp}/x.h5 --out-dir {tmp}/f"])  # fmt: skip
def test_a_backend_matplotlib_lacks_is_one_error(command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Old code: matplotlib's ValueError with a traceback, raised as the command imported it."""
    monkeypatch.setenv("MPLBACKEND", "garbage")
    root = tmp_path / "shared"
    root.mkdir()
    case = Case("MPLBACKEND garbage", command, r"MPLBACKEND='garbage' is not a matplotlib backend", prepare=_good,
                subprocess=True)  # fmt: skip
    run_case(case, {"root": str(root)}, tmp_path, capsys)


def test_a_config_nested_100000_deep_is_one_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Old code: RecursionError from Python's TOML parser, with a traceback."""
    root = tmp_path / "shared"
    root.mkdir()
    case = Case("TOML 100,000 deep", "plot --config {tmp}/c.toml --scheme alibi --input {tmp}/x.h5",
                r"c\.toml is nested too deeply", code=2, prepare=_deep, subprocess=True)  # fmt: skip
    run_case(case, {"root": str(root)}, tmp_path, capsys)
