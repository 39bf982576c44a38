"""Errors a user can fix: the CLI prints them as one ``Error:`` line instead of a traceback."""

from __future__ import annotations

import errno
import os
import re


class BiasvizError(Exception):
    """A problem with the user's input or environment, with a message that says what to do.

    The CLI turns it into ``Error: <message>`` on stderr and exit code 1.
    """

    exit_code = 1


class MasksDifferBySample(BiasvizError):
    """An attention call formed one sample's rows otherwise than another's: its mask (the bank then keeps each
    sample's own cells), or its scale or bias, which rows formed again take once for every sample (a summary then
    streams them instead)."""


class AttendsPastQuery(MasksDifferBySample):
    """An attention call whose first sample attended no key after its query did for a later sample (a prefix seen both
    ways, its length set by the text): the call's rule is every key, within its own mask, not the causal triangle
    that the first sample showed. A run goes on under that rule; this is raised only where it cannot (torchrun's
    processes, which join one mask)."""


def past_query_said(call: str, start: int) -> str:
    """What a run says of ``call`` (``"attention call 3"``, ``"layer 3"``), taken as causal as its first sample showed,
    that attends keys after a query from the batch of sample ``start`` on."""
    return (f"{call} attended keys after a query for sample {start} or one of its batch, though the first sample's "
            "attended none (a prefix seen both ways, or a padded query that the model's mask gives every key, say): "
            "its cells are taken as a call's that sees every key, within its own mask")  # fmt: skip


class UsageError(BiasvizError):
    """A bad combination of command-line options (exit code 2, like Click's own usage errors)."""

    exit_code = 2


# errno values that mean "the disk (or a quota, or a file-size limit) is full", and what to do about them
_NO_SPACE = {"ENOSPC", "EFBIG", "EDQUOT"}


def _errno_name(exc: OSError) -> str:
    """The symbolic errno of ``exc`` (HDF5 reports it only inside its message: ``errno = 28``)."""
    code = exc.errno
    if code is None:
        found = re.search(r"errno = (\d+)", str(exc))
        code = int(found.group(1)) if found else None
    return errno.errorcode.get(code, "") if code is not None else ""


def underlying_os_error(exc: BaseException | None) -> OSError | None:
    """The operating-system error behind ``exc``: itself, one it was raised from or while handling, or one
    its message names (HDF5: ``errno = 27``; safetensors: ``os error 28``). None when there is none.

    Libraries turn a full disk into errors of their own (matplotlib fails on with an AttributeError):
    this finds the cause the user can act on.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError):
            return exc
        found = re.search(r"(?:errno = |os error )(\d+)", str(exc))
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
        exc = exc.__cause__ or exc.__context__
    return None


def os_error_message(exc: OSError, path: object = None, action: str = "write") -> str:
    """One line for an operating-system error: which file, what went wrong, and what to do.

    ``path`` names the file when ``exc`` does not (HDF5's errors carry no file name). Used where a
    write can fail for reasons outside biasviz (full disk, permissions), so the user sees a fix,
    not a traceback.
    """
    name = _errno_name(exc)
    where = path if path is not None else exc.filename
    # HDF5's reads and writes name no file: then say what failed rather than which file
    subject = f"cannot {action} {where}" if where else "a file operation failed"
    text = exc.strerror or str(exc)
    reason = text.splitlines()[0] if text.strip() else type(exc).__name__
    if name and ("errno = " in text or path is not None):  # HDF5's long message names its temporary file
        reason = os.strerror(getattr(errno, name))
    if name in _NO_SPACE:
        what = {"ENOSPC": "the disk is full", "EFBIG": "the file exceeds the allowed file size",
                "EDQUOT": "the disk quota is exhausted"}[name]  # fmt: skip
        return f"{subject}: no space left ({what}); free some space or write elsewhere"
    if name in ("EACCES", "EPERM", "EROFS"):
        return f"{subject}: {reason}; check its permissions or choose another location"
    if name == "ENOENT":
        return f"{subject}: {reason}; check the path"
    if name in ("EISDIR", "ENOTDIR"):
        return f"{subject}: {reason}; give a file path where a file is expected"
    return f"{subject}: {reason}"


def too_long(scheme: str, max_length: int, seq_len: int, what: str = "sequence length") -> BiasvizError:
    """The one message for a length beyond a learned position table (the model and extraction use it)."""
    return BiasvizError(
        f"{what} {seq_len} exceeds the {max_length} positions of this '{scheme}' model "
        f"(learned absolute positions cannot extrapolate); use --seq-len {max_length} or less"
    )


_interrupted = False


def note_interrupt() -> None:
    """Record an interrupt that arrived where it could not be raised (inside a finaliser)."""
    global _interrupted
    _interrupted = True


def check_interrupted() -> None:
    """Raise the interrupt recorded by :func:`note_interrupt`, once, at a point where it can unwind."""
    global _interrupted
    if _interrupted:
        _interrupted = False
        raise KeyboardInterrupt
