"""Positional schemes: the table that says what each is (:mod:`.registry`, no torch) and the modules
that implement them (one per scheme family, imported only when a model is built).

Adding a scheme means one entry in ``registry.TABLE`` and one module here defining a
:class:`PositionScheme` subclass decorated with :func:`register`, plus its tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from biasviz.schemes.registry import TABLE, SchemeInfo, all_names, canonical_name, info, names, scheme_class

if TYPE_CHECKING:
    from biasviz.schemes.base import PositionScheme

_COPIED = ("aliases", "formula", "reference", "context_dependent", "adds_bias", "absolute_positions", "rotary")


def register(cls: type) -> type:
    """Class decorator: give a scheme class the descriptive attributes of its table entry.

    The class names itself (``name = "alibi"``); everything else it is described by lives in the table.
    """
    entry = info(cls.name)
    if entry.name != cls.name or entry.cls != cls.__name__:
        raise ValueError(f"scheme class {cls.__name__} does not match the table entry for '{entry.name}'")
    for attr in _COPIED:
        setattr(cls, attr, getattr(entry, attr))
    cls.default_options = dict(entry.default_options)
    cls.order = [s.name for s in TABLE].index(entry.name)
    return cls


def get_scheme(name: str) -> type[PositionScheme]:
    """The scheme class registered under ``name`` or one of its aliases (imports torch)."""
    return scheme_class(name)


class _Classes(Mapping[str, type]):
    """Scheme name -> class, in listing order; a class is imported when it is looked up."""

    def __getitem__(self, name: str) -> type:
        if name not in names():
            raise KeyError(name)
        return scheme_class(name)

    def __iter__(self) -> Iterator[str]:
        return iter(names())

    def __len__(self) -> int:
        return len(TABLE)


SCHEMES: Mapping[str, type] = _Classes()


def __getattr__(attr: str) -> Any:
    if attr == "PositionScheme":  # the base class, imported (with torch) only by those who need it
        from biasviz.schemes.base import PositionScheme

        return PositionScheme
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


__all__ = [
    "SCHEMES", "TABLE", "PositionScheme", "SchemeInfo", "all_names", "canonical_name", "get_scheme", "info",
    "names", "register",
]  # fmt: skip
