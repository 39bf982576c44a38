"""Checks on an output file's path, made before any work: biasviz replaces only what it may replace."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

from biasviz.common.errors import BiasvizError


def resolved(path: Path) -> Path:
    """``path`` with its links followed as far as they go (a link loop stops there, never raises)."""
    try:
        return Path(path).resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python 3.11's word for a link loop
        return Path(os.path.abspath(path))


def link_loop(path: Path) -> bool:
    """Whether ``path`` (or a folder on its way) is a symbolic link loop: nothing can ever be found there."""
    try:
        os.stat(path)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def check_no_loop(path: Path, option: str = "--out") -> None:
    """One clear error for an output path that is a link loop, before anything reads or writes there."""
    if link_loop(Path(path)):
        raise BiasvizError(f"{path} is a symbolic link loop (too many levels of symbolic links); remove the link or "
                           f"choose another {option}")  # fmt: skip


def make_output_folder(folder: Path, option: str = "--out") -> None:
    """Create an output's folder (and its parents) as its writer would; a failure is one clear error."""
    check_no_loop(folder, option)
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BiasvizError(f"cannot create the output folder {folder}: {exc.strerror}; choose another "
                           f"{option}") from exc  # fmt: skip


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file, however spelled (links, ``..``)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return resolved(a) == resolved(b)


def input_path(spec: str | Path | None) -> Path | None:
    """The file or folder an input option names (``code.py:FACTORY`` names ``code.py``); None when none."""
    if spec is None or str(spec) == "":
        return None
    text = str(spec)
    if ":" in text and not Path(text).exists():
        head = text.rsplit(":", 1)[0]
        if Path(head).exists():
            return Path(head)
    return Path(text)


def input_clash(target: Path, inputs: Iterable[str | Path | None]) -> Path | None:
    """The input that writing ``target`` would destroy, or None.

    That is an input ``target`` names (however spelled: links, ``..``, a hard link), a file an input folder
    holds (a text folder, a checkpoint), or, when ``target`` is a folder to be replaced, an input inside it.
    """
    target = Path(target)
    here = target.exists() or target.is_symlink()
    where = resolved(target)
    for spec in inputs:
        p = input_path(spec)
        if p is None or not p.exists():
            continue
        if same_file(p, target):
            return p
        if here and p.is_dir() and where.is_relative_to(resolved(p)):
            return p
        if target.is_dir() and resolved(p).is_relative_to(where):
            return p
    return None


def check_inputs_kept(target: Path, inputs: Iterable[str | Path | None], option: str = "--out") -> None:
    """Refuse ``target`` when writing it would destroy an input (:func:`input_clash`), ``--force`` or not."""
    clash = input_clash(target, inputs)
    if clash is None:
        return
    if same_file(clash, Path(target)):
        raise BiasvizError(f"{target} is one of the input files; give another {option}")
    inside = Path(target).is_dir() and resolved(clash).is_relative_to(resolved(Path(target)))
    detail = f"holds an input ({clash})" if inside else f"is inside an input folder ({clash})"
    raise BiasvizError(f"{target} {detail}; give another {option}")


def check_output_file(target: Path, inputs: Iterable[str | Path | None] = (), force: bool = False,
                      option: str = "--out") -> Path:  # fmt: skip
    """``target`` if a file may be written there: not a folder, none of ``inputs``, new unless ``force``.

    An input file is refused even with ``force``: writing there would destroy what the output is made from.
    """
    target = Path(target)
    check_no_loop(target, option)
    if target.is_dir():
        raise BiasvizError(f"{target} is a folder; give a file path for {option}")
    check_inputs_kept(target, inputs, option)
    if (target.exists() or target.is_symlink()) and not force:
        raise BiasvizError(f"{target} already exists; pass --force to overwrite it or choose another {option}")
    return target


def appeared_meanwhile(target: Path, option: str = "--out") -> BiasvizError:
    """The one message for a never-overwrite output that another process created while this one worked."""
    return BiasvizError(f"{target} already exists: it appeared while this run was writing it and was kept as it "
                        f"is; pass --force to overwrite it or choose another {option}")  # fmt: skip


_STEM_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_+.")
STEM_MAX = 80


def file_stem(text: str) -> str:
    """``text`` (a name read from a file, say) as one safe file-name component: letters, digits and ``-_+.``
    kept, anything else ``_``; no leading dot, no empty name, at most 80 characters. Never a path.

    >>> file_stem("kerple-log"), file_stem("../../etc/passwd"), file_stem(""), file_stem("a/b\\\\c")
    ('kerple-log', '_.._etc_passwd', 'unnamed', 'a_b_c')
    """
    stem = "".join(ch if ch in _STEM_CHARS else "_" for ch in str(text))[:STEM_MAX]
    stem = stem.lstrip(".") if stem.strip(".") else ""
    return stem or "unnamed"
