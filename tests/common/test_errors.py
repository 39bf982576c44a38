"""Errors a user can fix (:mod:`biasviz.common.errors`): an operating-system error becomes one line naming the
file, the reason and what to do, found behind a library's own error or inside its message; the one message for a
length beyond a learned position table; an interrupt noted where it could not be raised is raised once later."""

from __future__ import annotations

import errno
import os

import pytest

from biasviz.common.errors import (
    BiasvizError,
    UsageError,
    check_interrupted,
    note_interrupt,
    os_error_message,
    too_long,
    underlying_os_error,
)


def os_error(code: int, filename: str | None = None) -> OSError:
    return OSError(code, os.strerror(code), filename) if filename else OSError(code, os.strerror(code))


def test_exit_codes_are_one_for_errors_and_two_for_usage() -> None:
    assert BiasvizError.exit_code == 1 and UsageError.exit_code == 2 and issubclass(UsageError, BiasvizError)


@pytest.mark.parametrize(("code", "fix"), [
    (errno.ENOSPC, "no space left (the disk is full); free some space or write elsewhere"),
    (errno.EFBIG, "no space left (the file exceeds the allowed file size); free some space or write elsewhere"),
    (errno.EDQUOT, "no space left (the disk quota is exhausted); free some space or write elsewhere"),
])  # fmt: skip
def test_a_full_disk_says_so_and_what_to_do(code: int, fix: str) -> None:
    assert os_error_message(os_error(code), "out.h5") == f"cannot write out.h5: {fix}"


@pytest.mark.parametrize(("code", "fix"), [
    (errno.EACCES, "check its permissions or choose another location"),
    (errno.EROFS, "check its permissions or choose another location"),
    (errno.ENOENT, "check the path"),
    (errno.EISDIR, "give a file path where a file is expected"),
])  # fmt: skip
def test_each_cause_has_its_fix_and_the_errors_own_file_name(code: int, fix: str) -> None:
    got = os_error_message(os_error(code, "/data/x.h5"), action="read")
    assert got == f"cannot read /data/x.h5: {os.strerror(code)}; {fix}"


def test_an_error_naming_no_file_says_what_failed() -> None:
    assert os_error_message(os_error(errno.EIO)) == f"a file operation failed: {os.strerror(errno.EIO)}"


def test_hdf5s_message_is_read_for_its_errno() -> None:
    """HDF5 gives no errno, only ``errno = 28`` inside a long message naming its temporary file."""
    exc = OSError("Unable to synchronously create file (file write failed: time = x, filename = '/t/.tmp123', "
                  "errno = 28, error message = 'No space left on device')")  # fmt: skip
    assert os_error_message(exc, "a.h5") == ("cannot write a.h5: no space left (the disk is full); free some space "
                                             "or write elsewhere")  # fmt: skip


def test_the_os_error_behind_a_librarys_error_is_found() -> None:
    cause = os_error(errno.ENOSPC)
    try:
        try:
            raise cause
        except OSError as exc:
            raise AttributeError("'NoneType' object has no attribute 'write'") from exc
    except AttributeError as outer:
        assert underlying_os_error(outer) is cause


@pytest.mark.parametrize("text", ["safetensors: I/O error: os error 28", "HDF5: errno = 28, more"])
def test_an_os_error_named_in_a_message_is_made(text: str) -> None:
    found = underlying_os_error(RuntimeError(text))
    assert isinstance(found, OSError) and found.errno == 28 and found.strerror == os.strerror(28)


def test_no_os_error_anywhere_is_none_even_in_a_cycle() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert underlying_os_error(a) is None and underlying_os_error(None) is None


def test_too_long_names_the_scheme_the_table_and_the_fix() -> None:
    err = too_long("learned", 256, 300)
    assert isinstance(err, BiasvizError)
    assert str(err) == ("sequence length 300 exceeds the 256 positions of this 'learned' model (learned absolute "
                        "positions cannot extrapolate); use --seq-len 256 or less")  # fmt: skip


def raises_interrupt() -> bool:
    """Whether check_interrupted raises, caught here: a KeyboardInterrupt let through would stop pytest itself
    rather than fail the test."""
    try:
        check_interrupted()
    except KeyboardInterrupt:
        return True
    return False


def test_a_noted_interrupt_is_raised_once() -> None:
    assert not raises_interrupt()  # nothing noted: nothing raised
    note_interrupt()
    assert [raises_interrupt(), raises_interrupt()] == [True, False]  # raised once, not again
