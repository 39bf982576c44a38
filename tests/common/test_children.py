"""biasviz's own child processes (:mod:`biasviz.common.children`): the same interpreter, isolated (``-I``), with no
PYTHON* variable, this process's biasviz first on its path whatever the folder or the environment holds, no input,
and killed past its timeout."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import biasviz
from biasviz.common.children import biasviz_root, child_argv, child_environment, run_module


def test_biasviz_root_is_the_folder_this_biasviz_was_imported_from() -> None:
    assert biasviz_root() == str(Path(biasviz.__file__).resolve().parent.parent)


def test_child_environment_drops_exactly_the_python_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    monkeypatch.setenv("PYTHONSTARTUP", "/elsewhere/start.py")
    monkeypatch.setenv("BIASVIZ_PYTHONISH", "kept")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    env = child_environment()
    assert "PYTHONPATH" not in env and "PYTHONSTARTUP" not in env
    assert env["BIASVIZ_PYTHONISH"] == "kept" and env["OMP_NUM_THREADS"] == "1"
    assert not any(k.startswith("PYTHON") for k in env)


def test_child_argv_is_this_interpreter_isolated_then_the_arguments() -> None:
    argv = child_argv("biasviz.cli", "info", "--json")
    assert argv[:3] == [sys.executable, "-I", "-c"] and argv[-2:] == ["info", "--json"]
    assert "'biasviz.cli'" in argv[3] and len(argv) == 6


def test_the_child_imports_this_biasviz_whatever_the_folder_and_environment_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A ``biasviz/`` in the current folder and another on PYTHONPATH would each run as code; neither is on the
    child's path (``python -m site`` prints it), this process's biasviz is first, and ``biasviz --version`` runs."""
    for place in (tmp_path / "here", tmp_path / "path"):
        (place / "biasviz").mkdir(parents=True)
        (place / "biasviz" / "__init__.py").write_text("raise SystemExit('the wrong biasviz')\n")
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "path"))
    done = run_module("site", timeout=30)
    assert done.returncode == 0, done.stderr
    listed = ast.literal_eval(done.stdout.split("sys.path = ", 1)[1].split("\nUSER_BASE", 1)[0])
    assert Path(listed[0]) == Path(biasviz.__file__).resolve().parent.parent
    assert not {"", ".", str(tmp_path / "here"), str(tmp_path / "path")} & set(listed)
    assert "ENABLE_USER_SITE: False" in done.stdout  # -I: no user site
    done = run_module("biasviz", "--version", timeout=30)
    assert (done.returncode, done.stdout) == (0, f"biasviz, version {biasviz.__version__}\n"), done.stderr


def test_the_child_has_no_input_and_outlives_no_timeout() -> None:
    """Run through ``python -m timeit``, which executes the statement it is given. This process's own input holds
    text for the time of the call: the child must not read it."""
    saved = os.dup(0)
    read, write = os.pipe()
    os.write(write, b"typed at the terminal\n")
    os.close(write)
    os.dup2(read, 0)
    os.close(read)
    try:
        done = run_module("timeit", "-n", "1", "-r", "1", "import sys; print(repr(sys.stdin.read()))", timeout=30)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
    assert done.returncode == 0 and done.stdout.startswith("''\n"), done  # stdin: /dev/null, never the caller's
    with pytest.raises(subprocess.TimeoutExpired):
        run_module("timeit", "-n", "1", "-r", "1", "import time; time.sleep(30)", timeout=0.5)
