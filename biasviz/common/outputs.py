"""Checks on an output file's path, made before any work: biasviz replaces only what it may replace."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from biasviz.common.errors import BiasvizError


def same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file, however spelled (links, ``..``)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def check_output_file(target: Path, inputs: Iterable[str | Path | None] = (), force: bool = False,
                      option: str = "--out") -> Path:  # fmt: skip
    """``target`` if a file may be written there: not a folder, none of ``inputs``, new unless ``force``.

    An input file is refused even with ``force``: writing there would destroy what the output is made from.
    """
    target = Path(target)
    if target.is_dir():
        raise BiasvizError(f"{target} is a folder; give a file path for {option}")
    if any(p is not None and Path(p).exists() and same_file(Path(p), target) for p in inputs):
        raise BiasvizError(f"{target} is one of the input files; give another {option}")
    if (target.exists() or target.is_symlink()) and not force:
        raise BiasvizError(f"{target} already exists; pass --force to overwrite it or choose another {option}")
    return target


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
