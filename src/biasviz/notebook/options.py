"""``biasviz.plot``'s keywords read as ``biasviz plot`` reads its options, so that Python takes the values the
command takes and refuses the others with the command's messages (which name its options), with no command run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from biasviz.common.errors import UsageError

#: Python keyword -> (the option of ``biasviz plot`` it sets, what it takes: a flag, a whole number or text)
OPTIONS = {"layer": ("--layer", "integer"), "sample": ("--sample", "text"), "step": ("--step", "integer"),
           "normalize": ("--normalize", "text"), "cmap": ("--cmap", "text"), "log": ("--log", "flag"),
           "log_distance": ("--log-distance", "flag"), "style": ("--style", "text"), "width": ("--width", "text"),
           "dpi": ("--dpi", "integer range"), "reduce": ("--reduce", "text"),
           "max_cells": ("--max-cells", "integer range")}  # fmt: skip


def checked(options: dict[str, Any]) -> dict[str, Any]:
    """The index options as the notebook API takes them everywhere (:mod:`biasviz.common.arguments`): numpy
    integers as integers; a float, a string or a bool one clear TypeError naming the option."""
    from biasviz.common.arguments import ArgumentValueError, whole

    out = dict(options)
    for name, valid in (("layer", "a stored layer, -1 the last"), ("step", "a training step of the sweep")):
        if out.get(name) is not None:
            out[name] = whole(name, out[name], valid)
    sample = out.get("sample")
    if isinstance(sample, str) and sample != "mean":
        raise ArgumentValueError(f"sample must be an index or 'mean', not {sample!r}")
    if sample is not None and not isinstance(sample, str):
        out["sample"] = whole("sample", sample, "an index from 0, or 'mean'")
    return out


def command_values(path: str | Path, kind: str, options: dict[str, Any]) -> tuple[Path, dict[str, Any]]:
    """(the input file, the options as the command's parameters hold them) for ``--input PATH --kind KIND`` and
    ``options`` (None or False: left out; True: a flag given). A value is read as the command reads its text:
    a flag given a value, an option given no value, a number that is not whole, a value outside the option's
    set or range, or a folder as the input: a UsageError in the words the command prints."""
    from biasviz.plotting.draw import check_option

    values: dict[str, Any] = {}
    extra: list[str] = []
    for name, value in options.items():
        option, takes = OPTIONS[name]
        if value is None or value is False:
            continue
        if takes == "flag":
            values[name] = True
            if value is not True:  # the command reads `--log VALUE` as the flag and an argument it has no place for
                extra.append(str(value))
        elif value is True:
            raise UsageError(f"Option '{option}' requires an argument.")
        else:
            values[name] = str(value)
    file = _input(path)
    check_option("kind", kind)
    for name, text in values.items():
        option, takes = OPTIONS[name]
        if takes.startswith("integer"):
            try:
                values[name] = int(text)
            except ValueError:
                raise UsageError(f"Invalid value for '{option}': {text!r} is not a valid {takes}.") from None
        check_option(option.removeprefix("--"), values[name])
    if extra:
        raise UsageError(f"Got unexpected extra argument{'s' if len(extra) > 1 else ''} ({' '.join(extra)})")
    return file, values


def _input(path: str | Path) -> Path:
    """``--input``'s path: never empty, never a folder."""
    text = str(path)
    if not text.strip():
        raise UsageError("Invalid value for '--input': is empty: give a path, or leave the option out for its default")
    if Path(text).is_dir():
        raise UsageError(f"Invalid value for '--input': File {text!r} is a directory.")
    return Path(text)


__all__ = ["OPTIONS", "checked", "command_values"]
