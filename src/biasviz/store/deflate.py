"""Deflate for HDF5's gzip filter: ISA-L when it is installed, zlib otherwise.

Both produce standard zlib streams, which every HDF5 reader inflates; ISA-L's (python-isal) levels 0-3
compress float matrices 3-15 times faster than zlib's level 1 at the same or a better ratio, and
compression is most of the cost of writing captured matrices. Levels above 3 go to zlib.
"""

from __future__ import annotations

import zlib
from typing import Any

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
