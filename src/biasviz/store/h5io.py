"""Small HDF5 helpers shared by the writers: attribute values, arrays from tensors, abandoning a failed file."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from biasviz.common.jsondoc import loads
from biasviz.common.names import display_name, utf8_data, utf8_text


def attr_value(key: str, value: Any) -> Any:
    """A value HDF5 stores as plain data: None -> '', lists -> arrays, dicts -> JSON text; a callable is measured now
    (a device's peak memory, recorded when the file is finished)."""
    if callable(value):
        value = value()
    if value is None:
        return ""
    if isinstance(value, Path):
        return display_name(value)  # HDF5 strings are UTF-8: a name that is not is recorded escaped
    if isinstance(value, str):
        return utf8_text(str(value))  # plain str: h5py cannot store str subclasses (torch's version string is one)
    if isinstance(value, Mapping):
        return json.dumps(utf8_data(value), sort_keys=True, default=lambda v: utf8_text(str(v)))
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    if isinstance(value, (bool, int, float, np.generic, np.ndarray)):
        return value
    raise TypeError(f"attribute {key!r}: cannot store a {type(value).__name__} as HDF5 data")


def json_attr(value: Any) -> Any:
    """What :func:`attr_value` stored as JSON text (a dict), read back; None for anything else (no text, not JSON):
    an attribute is data from elsewhere, parsed, never trusted to be what biasviz wrote."""
    if not isinstance(value, str):
        return None
    try:
        return loads(value, "an attribute")
    except ValueError:  # JSONTooLarge too: deeper than any attribute biasviz writes
        return None


def call_modules(value: Any, n_layers: int) -> list[str] | None:
    """The module that made each of a traced model's attention calls, as :data:`~biasviz.store.format.CALL_MODULES`
    records it (JSON text: a list of ``n_layers`` names); None where the file records none, or something else.

    >>> call_modules('["h.0.attn", "h.0.attn"]', 2), call_modules('["h.0.attn"]', 2), call_modules(None, 2)
    (['h.0.attn', 'h.0.attn'], None, None)
    """
    owners = json_attr(value)
    if isinstance(owners, list) and len(owners) == n_layers and all(isinstance(o, str) for o in owners):
        return owners
    return None


def drop_pending_writes(f: h5py.File) -> None:
    """Point an abandoned file's descriptor at /dev/null, so that closing it cannot fail.

    After a failed write (full disk), HDF5 still flushes its caches on close; when that close fails
    too, the library is left in a state that crashes the process later. The file is deleted
    anyway, so its pending writes may go nowhere.
    """
    try:
        fd = int(f.id.get_vfd_handle())
    except (TypeError, ValueError, OSError, RuntimeError):
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def as_numpy(array: Any) -> np.ndarray:
    """A NumPy view of an array or a CPU tensor (no copy when possible)."""
    if hasattr(array, "detach"):  # a torch tensor; torch is not imported here so readers stay light
        return array.detach().cpu().numpy()
    return np.asarray(array)


def in_use(exc: OSError) -> bool:
    """Whether HDF5 refused to open a file because another process writes it: its lock is held (EAGAIN), or,
    where locking is off, the writer's mark in the superblock says it is open for writing."""
    text = str(exc)
    return (isinstance(exc, BlockingIOError) or "unable to lock file" in text
            or "already open for write" in text)  # fmt: skip
