"""Checked reading of a file's attributes and links: the part of validation that full and summary files share.

Attributes are read as data only (text, numbers, arrays), never unpickled or evaluated, and every value
is checked for the type the reader needs before it is used; a wrong one is one :class:`BiasvizError`
naming the attribute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np

from biasviz.common.errors import BiasvizError


class AttrChecks:
    """Typed, checked access to the root attributes and datasets of an open HDF5 file (``_h5``, ``path``)."""

    path: Path
    _h5: h5py.File

    def _bad(self, what: str) -> BiasvizError:
        return BiasvizError(f"{self.path} is not a valid biasviz file: {what}; extract it again")

    def _read_attr(self, key: str, at: str = "") -> Any:
        """The root attribute ``key``, or the group ``at``'s."""
        try:
            value = (self._h5[at] if at else self._h5).attrs[key]
        except Exception as exc:  # an attribute of a type HDF5 cannot convert, or a damaged header
            raise self._bad(f"{_named(key, at)} cannot be read ({type(exc).__name__})") from exc
        return plain(value) if isinstance(value, (bytes, str)) else value

    def _int_attr(self, key: str, minimum: int | None = None) -> int:
        value = self._read_attr(key)
        arr = np.asarray(value)
        if arr.size != 1 or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
            raise self._bad(f"attribute '{key}' should be an integer, not {describe(value)}")
        number = int(arr.reshape(()).item())
        if minimum is not None and number < minimum:
            raise self._bad(f"attribute '{key}' is {number}, expected at least {minimum}")
        return number

    def _str_attr(self, key: str) -> str:
        value = self._read_attr(key)
        if isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "OSU":
            value = value.reshape(()).item()
            value = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if not isinstance(value, str):
            raise self._bad(f"attribute '{key}' should be text, not {describe(value)}")
        return value

    def _bool_attr(self, key: str, at: str = "") -> bool:
        """The root attribute ``key`` (or the group ``at``'s) as true or false: a bool or an integer, one value."""
        arr = np.asarray(self._read_attr(key, at))
        if arr.size != 1 or not (np.issubdtype(arr.dtype, np.bool_) or np.issubdtype(arr.dtype, np.integer)):
            raise self._bad(f"{_named(key, at)} should be true or false, not {describe(arr)}")
        return bool(arr.reshape(()).item())

    def _flag(self, key: str) -> bool:
        """An optional true/false attribute (absent: false)."""
        return self._bool_attr(key) if key in self._h5.attrs else False

    def _refuse_other_files(self, name: str) -> None:
        """``name`` must live in this file: an external link, external storage or a virtual dataset would make
        HDF5 read other files (a FIFO there blocks the reader forever)."""
        link = self._h5.get(name, getlink=True)
        if isinstance(link, h5py.ExternalLink):
            raise self._bad(f"'{name}' is an external link to another file ({short_text(link.filename)})")
        obj = self._h5.get(name) if link is not None else None
        if isinstance(obj, h5py.Dataset) and (obj.is_virtual or obj.external):
            raise self._bad(f"'{name}' keeps its data in another file (external or virtual storage)")

    def _refuse_other_files_anywhere(self) -> None:
        """No link anywhere in the file may lead to another file, and no dataset may keep its data in one: a
        file that only reads its own datasets today could be read whole by a later command (``info``, a copy)."""
        found: list[str] = []

        def look(name: str, link: h5py.HardLink | h5py.SoftLink | h5py.ExternalLink) -> None:
            if isinstance(link, h5py.ExternalLink) and not found:
                found.append(f"'{name}' is an external link to another file ({short_text(link.filename)})")
            elif isinstance(link, h5py.HardLink) and not found:
                obj = self._h5.get(name)
                if isinstance(obj, h5py.Dataset) and (obj.is_virtual or obj.external):
                    found.append(f"'{name}' keeps its data in another file (external or virtual storage)")

        self._h5.visititems_links(look)
        if found:
            raise self._bad(found[0])

    def _dataset(self, name: str) -> h5py.Dataset | None:
        """The dataset at ``name`` (None when absent), refused when it lives in another file or is no dataset."""
        if name not in self._h5:
            return None
        self._refuse_other_files(name)
        obj = self._h5.get(name)
        if not isinstance(obj, h5py.Dataset):
            raise self._bad(f"'{name}' is not a dataset")
        return obj


def text(value: str) -> str:
    """Text that can be printed: undecodable bytes (h5py keeps them as lone surrogates) become escapes."""
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def plain(value: Any) -> Any:
    """An attribute value as plain Python data (text, numbers, lists); bytes are decoded, never unpickled."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        return [plain(x) for x in value.tolist()] if value.dtype.kind in "OSV" else value.tolist()
    if isinstance(value, np.void):
        return plain(value.item())
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, (tuple, list)):
        return [plain(x) for x in value]
    return value


def short_text(value: str, limit: int = 60) -> str:
    return value if len(value) <= limit else value[:limit] + "..."


def _named(key: str, at: str) -> str:
    """How an error names an attribute: the root's ``attribute 'causal'``, a group's ``layer_2 attribute 'causal'``."""
    return f"{at} attribute '{key}'" if at else f"attribute '{key}'"


def describe(value: Any) -> str:
    """A short description of an attribute value for error messages (never its full, possibly huge, text)."""
    arr = np.asarray(value) if not isinstance(value, str) else None
    if arr is None:
        return f"text '{value[:40]}'" + ("..." if len(value) > 40 else "")
    return f"{arr.dtype} of shape {arr.shape}" if arr.ndim else f"{arr.dtype} {str(arr.item())[:40]!r}"


def shape_text(ds: h5py.Dataset) -> str:
    """``float32 (12, 16, 16)``: a dataset's type and shape, for error messages."""
    return f"{ds.dtype} {ds.shape}"


__all__ = ["AttrChecks", "describe", "plain", "shape_text", "short_text", "text"]
