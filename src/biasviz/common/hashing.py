"""SHA-256 of model files, recorded in every output so a figure can be traced to exact weights."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
from collections.abc import Iterable
from pathlib import Path

_BLOCK = 1 << 20
_started: dict[tuple[str, int, int], _Hashing] = {}  # (path, size, mtime) -> a digest under way or done


class _Hashing:
    """One file's SHA-256 on a daemon thread (a process that ends early does not wait for it)."""

    def __init__(self, path: Path) -> None:
        self.digest: str | None = None  # None: not readable (the caller hashes it itself and meets the error there)
        self._thread = threading.Thread(target=self._run, args=(path,), name="biasviz-sha256", daemon=True)
        self._thread.start()

    def _run(self, path: Path) -> None:
        with contextlib.suppress(OSError):
            self.digest = _digest(path)

    def result(self) -> str | None:
        self._thread.join()
        return self.digest


def _identity(path: str | Path) -> tuple[str, int, int] | None:
    """What must not change between a digest begun early and its use: the file's real path, size and mtime."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except OSError:
        return None
    return real, st.st_size, st.st_mtime_ns


def start_hashing(paths: Iterable[str | Path]) -> None:
    """Begin the SHA-256 of ``paths`` on threads of their own, for :func:`sha256_file` to take up.

    A command that records a model's digest reads its weights once more just for that (0.4 s for GPT-2-small's
    486 MB); begun before the model's load, which imports transformers on one core, it costs the command nothing
    where a second core is free. A file whose path, size or modification time changed by then is hashed again.
    """
    if (os.cpu_count() or 1) < 2:
        return
    for path in paths:
        key = _identity(path)
        if key is not None and key not in _started:
            _started[key] = _Hashing(Path(key[0]))


def _digest(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of one file, read in 1 MiB blocks (checkpoints can be gigabytes).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile(delete=False) as f:
    ...     _ = f.write(b"abc")
    >>> sha256_file(f.name)[:16]
    'ba7816bf8f01cfea'
    >>> os.unlink(f.name)
    """
    key = _identity(path)
    early = _started.pop(key, None) if key is not None else None
    if early is not None and (digest := early.result()) is not None and _identity(path) == key:
        return digest
    return _digest(path)


def sha256_files(paths: Iterable[str | Path]) -> str:
    """One digest for several files (sharded weights): the file's own digest when there is one.

    For several files, the SHA-256 of the lines ``<name> <sha256>`` in name order.
    """
    files = sorted(Path(p) for p in paths)
    if len(files) == 1:
        return sha256_file(files[0])
    lines = "".join(f"{p.name} {sha256_file(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()
