"""Checks on the files a user names, made before anything reads them.

Reading a FIFO blocks until some other process writes to it, and a device such as /dev/zero never ends:
either would hang biasviz (or fill its memory) instead of failing. Every file biasviz reads by name
goes through :func:`regular_file` first; files read whole through :func:`read_bytes` or :func:`read_text`, which
bound their size.
"""

from __future__ import annotations

import os
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


#: bytes of a side file read whole (a config, training.json, tokenizer.json, a device map, a TOML config): these
#: are kilobytes to tens of megabytes; a link to a huge or endless file must fail here, not fill the memory
SIDE_FILE_BYTES = 256 << 20


#: the small files beside a model's weights that biasviz or transformers read whole
SIDE_FILES = ("config.json", "training.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
              "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
              "tokenizer.model", "chat_template.jinja")  # fmt: skip


def check_side_files(folder: Path, *, every_json: bool = True) -> None:
    """Every side file in ``folder`` (:data:`SIDE_FILES`, and with ``every_json`` any ``*.json``) is a regular file
    of at most :data:`SIDE_FILE_BYTES`: a FIFO would hang its reader, a link to /dev/zero fill the memory, and
    some are read by libraries that check nothing. Absent files are left to their readers."""
    names = set(SIDE_FILES)
    if every_json:
        names.update(p.name for p in folder.glob("*.json"))
    for name in sorted(names):
        p = folder / name
        if not os.path.lexists(p):
            continue
        regular_file(p, f"checkpoint's {name}")
        try:
            size = p.stat().st_size
        except OSError as exc:
            raise BiasvizError(os_error_message(exc, p, action="read")) from exc
        if size > SIDE_FILE_BYTES:
            raise BiasvizError(f"{p} is {size:,} bytes; a checkpoint's {name} biasviz reads is at most "
                               f"{SIDE_FILE_BYTES:,} bytes: it is not one, or is damaged")  # fmt: skip


def read_bytes(path: str | Path, what: str = "file", *, limit: int | None = SIDE_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (None: any size); operating-system errors become
    one line naming ``path``.

    The file is opened without blocking (a FIFO put in its place after the check cannot hang the open) and
    checked again on the open descriptor, so what is read is what was checked.
    """
    p = regular_file(path, what)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise BiasvizError(os_error_message(exc, p, action="read")) from exc
    with os.fdopen(fd, "rb") as f:
        mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
        if not stat.S_ISREG(mode):
            raise BiasvizError(f"{p} is not a regular file; give a {what} biasviz can read to the end")
        if limit is not None and size > limit:
            raise BiasvizError(f"{p} is {size:,} bytes; a {what} biasviz reads is at most {limit:,} bytes: it is "
                               "not one, or is damaged")  # fmt: skip
        try:
            data = f.read() if limit is None else f.read(limit + 1)
        except OSError as exc:
            raise BiasvizError(os_error_message(exc, p, action="read")) from exc
    if limit is not None and len(data) > limit:  # it grew while read
        raise BiasvizError(f"{p} grew past {limit:,} bytes while read; a {what} biasviz reads is smaller")
    return data


def read_text(path: str | Path, what: str = "text file", *, strict: bool = True,
              limit: int | None = SIDE_FILE_BYTES) -> str:  # fmt: skip
    """A regular file's UTF-8 text of at most ``limit`` bytes. ``strict``: other bytes are an error; else replaced,
    with a warning."""
    data = read_bytes(path, what, limit=limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"byte {exc.start}"
        if strict:
            raise BiasvizError(f"{path} is not UTF-8 text (undecodable {where}); save it as UTF-8") from None
        warnings.warn(f"{path} is not UTF-8 text (undecodable {where}); its other bytes were replaced by U+FFFD",
                      UserWarning, stacklevel=2)  # fmt: skip
        return data.decode("utf-8", errors="replace")
