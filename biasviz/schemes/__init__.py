"""The registry of positional schemes: the model, the CLI, README and tests all read it.

Adding a scheme means adding one module to this package that defines a :class:`PositionScheme`
subclass decorated with :func:`register`; it is discovered automatically.
"""

from __future__ import annotations

import importlib
import pkgutil

from biasviz.errors import BiasvizError
from biasviz.schemes.base import PositionScheme

SCHEMES: dict[str, type[PositionScheme]] = {}
_ALIASES: dict[str, str] = {}


def register(cls: type[PositionScheme]) -> type[PositionScheme]:
    """Class decorator: add a scheme (and its aliases) to the registry."""
    for key in (cls.name, *cls.aliases):
        if key in SCHEMES or key in _ALIASES:
            raise ValueError(f"scheme name '{key}' registered twice")
    SCHEMES[cls.name] = cls
    for alias in cls.aliases:
        _ALIASES[alias] = cls.name
    return cls


def canonical_name(name: str) -> str:
    """Resolve an alias (``kerple``, ``t5-bias``) to the scheme's own name; error if unknown."""
    key = name.strip().lower()
    if key in SCHEMES:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    valid = ", ".join(sorted([*SCHEMES, *_ALIASES]))
    raise BiasvizError(f"unknown scheme '{name}'; valid schemes: {valid}")


def get_scheme(name: str) -> type[PositionScheme]:
    """The scheme class registered under ``name`` or one of its aliases."""
    return SCHEMES[canonical_name(name)]


def all_names() -> list[str]:
    """Every accepted spelling: scheme names followed by aliases."""
    return [*SCHEMES, *_ALIASES]


def _discover() -> None:
    for info in pkgutil.iter_modules(__path__):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")
    # list schemes in a stable, meaningful order (SPEC section 1), not in file order
    ordered = sorted(SCHEMES.values(), key=lambda c: (c.order, c.name))
    SCHEMES.clear()
    SCHEMES.update({c.name: c for c in ordered})


_discover()

__all__ = ["SCHEMES", "PositionScheme", "register", "canonical_name", "get_scheme", "all_names"]
