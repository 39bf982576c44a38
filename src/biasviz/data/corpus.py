"""Text corpora: the user's files, or the built-in default that every machine has offline.

The default corpus is the source of Python's own standard library: real, varied text that is
present wherever biasviz runs, so the built-in pipeline needs no download.
"""

from __future__ import annotations

import errno
import os
import sysconfig
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from biasviz.common.errors import BiasvizError
from biasviz.common.inputs import read_bytes, read_text, regular_file

DEFAULT_CORPUS = "stdlib"
DEFAULT_MAX_BYTES = 8_000_000
TEXT_SUFFIXES = {".txt", ".md", ".rst", ".py", ".text", ".tex", ".json", ".jsonl", ".csv", ".html", ".xml"}


@dataclass(frozen=True)
class Corpus:
    """Documents plus a description of where they came from (stored as provenance)."""

    documents: list[str]
    source: str

    @property
    def n_bytes(self) -> int:
        return sum(len(d) for d in self.documents)


STDLIB_SKIP = frozenset({"test", "tests", "idlelib", "site-packages", "lib2to3", "__pycache__"})


def _stdlib_files() -> Iterator[Path]:
    """The standard library's ``*.py`` files outside :data:`STDLIB_SKIP`, in the order of their paths relative to the
    root (as strings), found as they are read.

    Listing them all first (``rglob`` then sorting) walked every package installed beside Python, 13,000 files for
    the 600 kept, to read the first few dozen: 0.4 s of every ``extract``. A directory is walked only when reading
    reaches it, and a skipped one never.
    """
    root = Path(sysconfig.get_paths()["stdlib"])
    if root.is_dir():
        yield from _sorted_py_files(root)


def _sorted_py_files(directory: Path) -> Iterator[Path]:
    """``rglob("*.py")``'s paths under ``directory`` (symbolic links to directories not followed) in string order.

    Every path below a directory ``d`` starts with ``d/``, so they all sort between the entries of ``d``'s own
    folder as if ``d`` were named ``d/``: sorting one folder at a time by that key gives the order of the whole.
    """
    try:
        with os.scandir(directory) as listing:
            entries = list(listing)
    except PermissionError:  # rglob leaves out a folder it may not read
        return
    keyed: list[tuple[str, bool]] = []
    for entry in entries:
        if entry.name in STDLIB_SKIP:  # every path through it is skipped
            continue
        if entry.name.endswith(".py"):
            keyed.append((entry.name, False))
        if _is_folder(entry):
            keyed.append((entry.name + "/", True))
    for key, folder in sorted(keyed):
        if folder:
            yield from _sorted_py_files(directory / key[:-1])
        else:
            yield directory / key


def _is_folder(entry: os.DirEntry[str]) -> bool:
    """A real directory, as rglob tells one (an entry that vanished or loops is none)."""
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP):
            return False
        raise


def _text_files(path: Path) -> list[Path]:
    if not path.is_dir():
        return [regular_file(path, "text file")]
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise BiasvizError(f"no text files ({', '.join(sorted(TEXT_SUFFIXES))}) under {path}")
    return files


def open_corpus(path: str | Path | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES) -> tuple[Iterator[str], str]:
    """The documents of a corpus, read one at a time as they are needed, and where they come from.

    ``path`` is a file, a directory of text files, or ``None``/``"stdlib"`` for the default. Files are
    read in sorted order and undecodable bytes replaced, so the same files always give the same text.
    Reading stops after ``max_bytes`` characters (``None``: read everything).
    """
    if path is None or str(path) == DEFAULT_CORPUS:
        files = _stdlib_files()
        source = f"stdlib:{sysconfig.get_paths()['stdlib']}"
    else:
        p = Path(path).expanduser()
        if not p.exists():
            raise BiasvizError(f"corpus path {p} does not exist; give a text file or a directory of them")
        files = _text_files(p)
        source = str(p.resolve())
    return _read(files, max_bytes, source, warn=path is not None and str(path) != DEFAULT_CORPUS), source


def _read(files: Iterable[Path], max_bytes: int | None, source: str, *, warn: bool = True) -> Iterator[str]:
    """Each file's text; bytes that are not UTF-8 are replaced (with a warning for the user's own files)."""
    total = 0
    for f in files:
        if warn:
            text = read_text(f, "text file", strict=False, limit=None)  # the corpus itself: any size
        else:
            text = read_bytes(f, "text file", limit=None).decode("utf-8", errors="replace")
        if not text.strip():
            continue
        if max_bytes is not None and total + len(text) > max_bytes:
            text = text[: max_bytes - total]
        yield text
        total += len(text)
        if max_bytes is not None and total >= max_bytes:
            return
    if total == 0:
        raise BiasvizError(f"the corpus at {source} holds no text")


def load_corpus(path: str | Path | None = None, max_bytes: int | None = DEFAULT_MAX_BYTES) -> Corpus:
    """Read a whole corpus (see :func:`open_corpus`) into memory, for training."""
    documents, source = open_corpus(path, max_bytes)
    return Corpus(list(documents), source)
