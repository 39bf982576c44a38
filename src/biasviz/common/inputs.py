"""Checks on the files a user names, made before anything reads them.

Reading a FIFO blocks until some other process writes to it, and a device such as /dev/zero never ends:
either would hang biasviz (or fill its memory) instead of failing. Every file biasviz reads by name
goes through :func:`regular_file` first; text files through :func:`read_text`.
"""

from __future__ import annotations

import stat
import warnings
from pathlib import Path

from biasviz.common.errors import BiasvizError, os_error_message

_KINDS = {stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
          stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a folder"}  # fmt: skip


def kind_of(path: Path) -> str:
    """What ``path`` is, in words, when it is not a regular file ("" when it is one, or is missing)."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return ""
    return next((name for test, name in _KINDS.items() if test(mode)), "")


def regular_file(path: str | Path, what: str = "file") -> Path:
    """``path`` if it is a regular file (or a link to one); else a :class:`BiasvizError` that says what it is.

    Missing files are left to the caller, which knows what to suggest.
    """
    p = Path(path)
    kind = kind_of(p)
    if kind and kind != "a folder":
        raise BiasvizError(f"{p} is not a regular file but {kind}; give a {what} biasviz can read to the end")
    return p


def read_bytes(path: str | Path, what: str = "file") -> bytes:
    """The bytes of a regular file; operating-system errors become one line naming ``path``."""
    p = regular_file(path, what)
    try:
        return p.read_bytes()
    except OSError as exc:
        raise BiasvizError(os_error_message(exc, p, action="read")) from exc


def read_text(path: str | Path, what: str = "text file", *, strict: bool = True) -> str:
    """A regular file's UTF-8 text. ``strict``: other bytes are an error; else replaced, with a warning."""
    data = read_bytes(path, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"byte {exc.start}"
        if strict:
            raise BiasvizError(f"{path} is not UTF-8 text (undecodable {where}); save it as UTF-8") from None
        warnings.warn(f"{path} is not UTF-8 text (undecodable {where}); its other bytes were replaced by U+FFFD",
                      UserWarning, stacklevel=2)  # fmt: skip
        return data.decode("utf-8", errors="replace")
