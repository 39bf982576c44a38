"""SHA-256 of model files, recorded in every output so a figure can be traced to exact weights."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

_BLOCK = 1 << 20


def sha256_file(path: str | Path) -> str:
    """Hex SHA-256 of one file, read in 1 MiB blocks (checkpoints can be gigabytes).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile(delete=False) as f:
    ...     _ = f.write(b"abc")
    >>> sha256_file(f.name)[:16]
    'ba7816bf8f01cfea'
    >>> os.unlink(f.name)
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def sha256_files(paths: Iterable[str | Path]) -> str:
    """One digest for several files (sharded weights): the file's own digest when there is one.

    For several files, the SHA-256 of the lines ``<name> <sha256>`` in name order.
    """
    files = sorted(Path(p) for p in paths)
    if len(files) == 1:
        return sha256_file(files[0])
    lines = "".join(f"{p.name} {sha256_file(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()
