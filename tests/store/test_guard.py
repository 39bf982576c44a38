"""Opening a file from elsewhere in a child first (:mod:`biasviz.store.guard`): the time limit read from
``BIASVIZ_HDF5_TIMEOUT``, and what the child's exit, crash or time-out becomes."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

import biasviz.store.guard as guard
from biasviz.common.errors import BiasvizError
from biasviz.store.guard import check_isolated, time_limit


@pytest.mark.parametrize(("value", "seconds"), [
    (None, 60.0), ("", 60.0), ("   ", 60.0), ("2.5", 2.5), (" 30 ", 30.0), ("1e-3", 0.001),
    ("604800", 604800.0),  # a week exactly
])  # fmt: skip
def test_the_time_limit_is_the_variables_seconds(value: str | None, seconds: float,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    if value is None:
        monkeypatch.delenv("BIASVIZ_HDF5_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("BIASVIZ_HDF5_TIMEOUT", value)
    assert time_limit() == seconds


@pytest.mark.parametrize("value", ["0", "-5", "604801", "nan", "inf", "-inf", "1e400", "soon", "5 s"])
def test_a_time_limit_outside_a_week_or_not_a_number_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIASVIZ_HDF5_TIMEOUT", value)
    with pytest.raises(BiasvizError) as exc:
        time_limit()
    assert str(exc.value) == (f"BIASVIZ_HDF5_TIMEOUT={value!r} is not a number of seconds between 0 and 604800 "
                              "(default 60)")  # fmt: skip


class Child:
    """Stands for the child process: records how it was started and ends as told."""

    def __init__(self, returncode: int = 0, stdout: str = "", timeout: bool = False) -> None:
        self.returncode, self.stdout, self.timeout = returncode, stdout, timeout
        self.calls: list[tuple[str, tuple[str, ...], float]] = []

    def __call__(self, module: str, *args: str, timeout: float) -> Any:
        self.calls.append((module, args, timeout))
        if self.timeout:
            raise subprocess.TimeoutExpired(["python"], timeout)
        return subprocess.CompletedProcess(["python"], self.returncode, self.stdout, "")


def outcome(child: Child, path: Path, monkeypatch: pytest.MonkeyPatch) -> str | None:
    monkeypatch.setattr(guard, "run_module", child)
    monkeypatch.setenv("BIASVIZ_HDF5_TIMEOUT", "2.5")
    try:
        check_isolated(path)
    except BiasvizError as exc:
        return str(exc)
    return None


def test_a_valid_file_passes_and_the_child_is_given_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    child = Child(0)
    assert outcome(child, Path("x.h5"), monkeypatch) is None
    assert child.calls == [("biasviz.store.reader", (str(tmp_path / "x.h5"),), 2.5)]


@pytest.mark.parametrize(("child", "message"), [
    (Child(1, "opening\n\nx.h5 is not a biasviz file\n\n"), "x.h5 is not a biasviz file"),  # its last line
    (Child(3, " \n"), "x.h5 could not be opened (exit code 3)"),
    (Child(-signal.SIGSEGV), "x.h5 crashed the HDF5 library (SIGSEGV) when opened: it is damaged or crafted; "
                             "extract it again"),
    (Child(-signal.SIGABRT), "x.h5 crashed the HDF5 library (SIGABRT) when opened"),
    (Child(timeout=True), "x.h5 took longer than 2.5 s to open and check: it is damaged or made to hang a reader "
                          "(a slow disk? raise BIASVIZ_HDF5_TIMEOUT)"),
])  # fmt: skip
def test_the_childs_failure_is_one_error(child: Child, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    got = outcome(child, Path("x.h5"), monkeypatch)
    assert got is not None and got.startswith(message)


def test_a_real_child_refuses_a_file_that_is_not_hdf5(tmp_path: Path) -> None:
    path = tmp_path / "notes.h5"
    path.write_text("my notes\n")
    with pytest.raises(BiasvizError, match=r"notes\.h5 is not a readable HDF5 file"):
        check_isolated(path)
    assert os.listdir(tmp_path) == ["notes.h5"]


def test_a_file_found_valid_is_checked_again_only_once_changed_or_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process that opens a file again (a notebook drawing it twice): one child for the unchanged file. Bytes added
    to it, or another file in its place, start a child again; a file found invalid is never taken as known."""
    from tests.project.test_untrusted import write_valid

    starts: list[str] = []
    real = guard.run_module

    def counted(module: str, *args: str, timeout: float) -> Any:
        starts.append(args[0])
        return real(module, *args, timeout=timeout)

    monkeypatch.setattr(guard, "run_module", counted)
    good = write_valid(tmp_path / "good.h5")
    check_isolated(good)
    check_isolated(good)
    assert len(starts) == 1
    with open(good, "ab") as f:  # still valid HDF5 (the superblock gives its end), but not the bytes checked
        f.write(b"\0" * 16)
    check_isolated(good)
    assert len(starts) == 2
    other = write_valid(tmp_path / "other.h5", n=3)
    os.replace(other, good)  # another file, under the name already checked
    check_isolated(good)
    check_isolated(good)
    assert len(starts) == 3
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"not hdf5")
    for _ in range(2):
        with pytest.raises(BiasvizError, match="not a readable HDF5 file"):
            check_isolated(bad)
    assert len(starts) == 5
