"""The one check of the notebook API's arguments: an index is an integer (Python's or numpy's), in range.

Every public method of ``biasviz.open(...)`` takes its layer, head, sample and step through :func:`pick`, so each
wrong value gets the same kind of message: a TypeError for the wrong kind of value, a ValueError for one out of
range, both naming the argument and what it may be (and both a :class:`BiasvizError`, one ``Error:`` line in the
CLI). A string ``"1"`` is never compared with the integer 1: that made "step 1 is not in the file; it holds
steps 0, 1, 2".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from biasviz.common.errors import BiasvizError


class ArgumentTypeError(BiasvizError, TypeError):
    """An argument of the wrong kind (a float, a string or None where an index is needed)."""


class ArgumentValueError(BiasvizError, ValueError):
    """An argument of the right kind but not one the file holds."""


def listed(values: Sequence[int], most: int = 12) -> str:
    """``0 to 11`` for a run of consecutive values, ``0, 5, 11`` otherwise (``...`` beyond ``most``).

    >>> listed([0, 1, 2, 3]), listed([1, 3]), listed([])
    ('0 to 3', '1, 3', 'none')
    """
    values = list(values)
    if not values:
        return "none"
    if len(values) > 2 and values == list(range(values[0], values[0] + len(values))):
        return f"{values[0]} to {values[-1]}"
    shown = ", ".join(map(str, values[:most]))
    return shown + (f", ... ({len(values)} in all)" if len(values) > most else "")


def whole(name: str, value: Any, valid: str) -> int:
    """``value`` as an int when it is a Python or numpy integer (never a bool); else ArgumentTypeError, whose
    message ends with ``valid`` (what the argument may be)."""
    import numbers

    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ArgumentTypeError(f"{name} must be an integer, not {value!r} ({type(value).__name__}); {valid}")


def pick(name: str, value: Any, valid: Sequence[int], where: object, *, negative: bool = False,
         described: str | None = None) -> int:  # fmt: skip
    """``value``, one of ``valid`` (as an int); with ``negative``, -1 is the last of them, -2 the one before.

    A non-integer is an ArgumentTypeError, an integer not there an ArgumentValueError; both name ``name``, the
    file ``where`` and the values it holds (or say ``described`` instead: "heads are numbered 1 to 12").
    """
    ordered = sorted(valid)
    holds = described or (f"it holds {name}s {listed(ordered)}" + (", and -1 is the last" if negative and ordered
                                                                   else ""))  # fmt: skip
    index = whole(name, value, holds.replace("it holds", f"{where} holds", 1))
    if negative and index < 0 and -index <= len(ordered):
        return ordered[index]
    if index not in ordered:
        raise ArgumentValueError(f"{name} {index} is not in {where}; {holds}")
    return index


__all__ = ["ArgumentTypeError", "ArgumentValueError", "listed", "pick", "whole"]
