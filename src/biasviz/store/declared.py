"""Declared sizes checked before any read: a small file can declare a huge dataset.

HDF5 stores no chunk it was never given: a 39 KiB file can declare a profile 2^31 distances long, and a reader
that trusts the shape asks for hundreds of GiB. Before anything is read, every dataset's largest piece a reader
takes at once (a summary's dataset whole, as float64; a full file's one matrix of one sample and head) and the
arrays the attributes imply (a profile over ``seq_len`` distances) are set against the memory this process may
use; a file that declares more is refused with the size it asked for.
"""

from __future__ import annotations

import math

import h5py

from biasviz.common.memory import memory_budget, size_text
from biasviz.store.validation import AttrChecks

FLOAT64 = 8


def largest_read(ds: h5py.Dataset, *, lead: int, matrices: bool) -> int:
    """Bytes of the largest piece of ``ds`` a reader takes at once: one checkpoint's (``lead`` leading axes) whole,
    at least as float64; with ``matrices`` (a full file's layer data) one sample and head's (query, key) matrix."""
    skip = lead + (2 if matrices and ds.ndim >= lead + 4 else 0)
    cells = math.prod(ds.shape[skip:])
    return cells * (ds.dtype.itemsize if ds.dtype.names else max(ds.dtype.itemsize, FLOAT64))


def check_declared(checks: AttrChecks, *, seq_len: int, n_heads: int, summary: bool) -> None:
    """Refuse a file whose attributes or datasets declare more than this process can hold (see the module)."""
    budget = memory_budget()
    if budget is None:
        return
    h5 = checks._h5
    lead = 1 if "checkpoint" in h5 else 0
    # what the attributes imply: a profile (mean and std per head) over every signed distance
    implied = 2 * n_heads * (2 * seq_len) * FLOAT64
    if implied > budget:
        raise checks._bad(f"its attributes 'n_heads' ({n_heads}) and 'seq_len' ({seq_len}) declare profiles of "
                          f"{size_text(implied)}, more than the {size_text(budget)} of memory biasviz may use here; "
                          "it is damaged or crafted")  # fmt: skip
    found: list[str] = []

    def look(name: str, obj: object) -> None:
        if found or not isinstance(obj, h5py.Dataset):
            return
        in_layer = "/" in name
        need = largest_read(obj, lead=lead if in_layer else 0, matrices=in_layer and not summary)
        if need > budget:
            found.append(f"'{name}' declares shape {obj.shape}, {size_text(need)} to read, more than the "
                         f"{size_text(budget)} of memory biasviz may use here; it is damaged or crafted")  # fmt: skip

    h5.visititems(look)
    if found:
        raise checks._bad(found[0])


__all__ = ["check_declared", "largest_read"]
