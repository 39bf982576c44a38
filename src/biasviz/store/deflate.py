"""Deflate for HDF5's gzip filter: ISA-L when it is installed, zlib otherwise.

Both produce standard zlib streams, which every HDF5 reader inflates; ISA-L's (python-isal) levels 0-3
compress float matrices 3-15 times faster than zlib's level 1 at the same or a better ratio, and
compression is most of the cost of writing captured matrices. Levels above 3 go to zlib.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np

try:
    from isal import isal_zlib as _isal
except ImportError:  # a platform without a python-isal wheel: zlib gives the same format, slower
    _isal = None

ISAL_MAX_LEVEL = 3


def deflate(data: Any, level: int) -> bytes:
    """``data`` (any buffer) as a zlib stream at ``level``.

    >>> import zlib; zlib.decompress(deflate(b"abc" * 100, 1)) == b"abc" * 100
    True
    """
    if _isal is not None and 0 <= level <= ISAL_MAX_LEVEL:
        return _isal.compress(data, level)
    return zlib.compress(data, level)


def compression_threads(requested: int | None = None) -> int:
    """Threads that compress chunks: ``requested``, or one per core; at least one.

    >>> compression_threads(0), compression_threads(3)
    (1, 3)
    """
    return max(1, os.cpu_count() or 1) if requested is None else max(1, int(requested))


def encode_chunk(chunk: np.ndarray, level: int | None, shuffle: bool) -> bytes | memoryview:
    """One HDF5 chunk (the whole array, C order) as the bytes its shuffle and deflate filters store: the
    shuffle puts byte k of every element together, for k = 0, 1, ...; the result goes to ``write_direct_chunk``.
    ``level`` None: no deflate (a dataset without the gzip filter), the array's own bytes (not copied).

    >>> import zlib; x = np.arange(3, dtype=np.uint16)
    >>> list(zlib.decompress(encode_chunk(x, 1, shuffle=True)))
    [0, 1, 2, 0, 0, 0]
    """
    m = np.ascontiguousarray(chunk)
    if shuffle:
        m = np.ascontiguousarray(m.reshape(-1).view(np.uint8).reshape(-1, m.itemsize).T)
    return m.data if level is None else deflate(m.data, level)
