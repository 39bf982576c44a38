"""An empty path (``--out ""`` on the command line or ``out = ""`` in a config) is one Error line naming the
option, before anything runs: it never means the current folder or, silently, the default output."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import run_cli

CASES = {
    "extract --out": (["extract", "--model", "m"], "extract", "out", "--out"),
    "train --out": (["train", "--scheme", "alibi"], "train", "out", "--out"),
    "plot --out-dir": (["plot", "--scheme", "alibi"], "plot", "out_dir", "--out-dir"),
    "plot --input": (["plot", "--scheme", "alibi"], "plot", "input", "--input"),
    "diagnose --json": (["diagnose", "a.h5"], "diagnose", "json", "--json"),
    "explore --out": (["explore", "a.h5"], "explore", "out", "--out"),
}


@pytest.mark.parametrize("value", ["", "  "])
@pytest.mark.parametrize("where", ["command line", "config"])
@pytest.mark.parametrize("case", list(CASES))
def test_an_empty_path_is_one_error_naming_the_option(case: str, where: str, value: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    args, command, key, option = CASES[case]
    if where == "config" and command == "explore":
        pytest.skip("explore takes no --config")
    monkeypatch.chdir(tmp_path)
    if where == "command line":
        args = [*args, option, value]
    else:
        (tmp_path / "c.toml").write_text(f'[{command}]\n{key} = "{value}"\n')
        args = [*args, "--config", "c.toml"]
    code, _, err = run_cli(args, capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("Error:") and option in lines[0] and "empty" in lines[0], err
    assert sorted(os.listdir(tmp_path)) == (["c.toml"] if where == "config" else [])
