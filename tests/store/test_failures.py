"""Write failures HDF5 reports while freeing an object (:mod:`biasviz.store.failures`): caught from the hooks h5py
reports them through, raised at the next check as the operating-system error they are, everything else passed on."""

from __future__ import annotations

import errno
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from biasviz.store import failures
from biasviz.store.failures import DeferredWriteErrors


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """The hooks in place before a write: they record what reaches them (and are put back after the test)."""
    seen: dict[str, list[Any]] = {"unraisable": [], "except": []}
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen["unraisable"].append(u.exc_value))
    monkeypatch.setattr(sys, "excepthook", lambda kind, value, tb: seen["except"].append(value))
    monkeypatch.setattr(failures.STATE, "damaged", False)
    return seen


def unraisable(exc: BaseException) -> SimpleNamespace:
    return SimpleNamespace(exc_value=exc, exc_type=type(exc), exc_traceback=None, err_msg=None, object=None)


# what h5py raises when HDF5 fails to write a freed object's metadata: a RuntimeError naming the errno
FULL_DISK = RuntimeError("Can't decrement id ref count (file write failed: time = Mon, errno = 28, error message = "
                         "'No space left on device')")  # fmt: skip


def test_a_failure_while_freeing_is_raised_at_the_next_check(hooks: dict[str, list[Any]]) -> None:
    before = (sys.unraisablehook, sys.excepthook)
    with DeferredWriteErrors() as deferred:
        assert (sys.unraisablehook, sys.excepthook) != before
        deferred.check()  # nothing yet
        sys.unraisablehook(unraisable(FULL_DISK))
        with pytest.raises(OSError) as exc:
            deferred.check()
    assert exc.value.errno == errno.ENOSPC
    assert (sys.unraisablehook, sys.excepthook) == before  # the hooks put back
    assert hooks == {"unraisable": [], "except": []}  # swallowed, not printed
    assert failures.STATE.damaged  # the library may not shut down cleanly now


def test_the_first_failure_is_kept_and_the_excepthook_is_caught_too(hooks: dict[str, list[Any]]) -> None:
    too_big = OSError(errno.EFBIG, "File too large")
    chained = RuntimeError("Problems closing file")
    chained.__cause__ = too_big
    with DeferredWriteErrors() as deferred:
        sys.excepthook(RuntimeError, chained, None)
        sys.unraisablehook(unraisable(FULL_DISK))
        with pytest.raises(OSError) as exc:
            deferred.check()
    assert exc.value is too_big
    assert hooks == {"unraisable": [], "except": []}


def test_anything_else_reaches_the_hooks_it_would_have_reached(hooks: dict[str, list[Any]]) -> None:
    bug = RuntimeError("a bug, no operating-system error behind it")
    other = ValueError("errno = 28 in the text of something that is no RuntimeError")
    with DeferredWriteErrors() as deferred:
        sys.unraisablehook(unraisable(bug))
        sys.excepthook(ValueError, other, None)
        deferred.check()
    assert hooks == {"unraisable": [bug], "except": [other]}
    assert not failures.STATE.damaged
