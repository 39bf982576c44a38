"""``biasviz.plot``'s keywords read as ``biasviz plot`` reads its options, so that Python takes the values the
command takes and refuses the others with the command's messages (which name its options), with no command run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from biasviz.common.errors import UsageError
from biasviz.plotting.options import INPUT, KIND, OPTIONS, PlotOption


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
    ``options`` (None or False: left out; True: a flag given). A value is read as the command reads its text, by
    the option's own click type (:mod:`biasviz.plotting.options`): a flag given a value, an option given no value,
    a number that is not whole, a value outside the option's set or range, or a folder as the input: a UsageError
    in the words the command prints."""
    values: dict[str, Any] = {}
    extra: list[str] = []
    for name, value in options.items():
        option = OPTIONS[name]
        if value is None or value is False:
            continue
        if option.flag:
            values[name] = True
            if value is not True:  # the command reads `--log VALUE` as the flag and an argument it has no place for
                extra.append(str(value))
        elif value is True:  # `--cmap` with nothing after it: click's parser says so, before any type reads a value
            raise UsageError(f"Option '{option.name}' requires an argument.")
        else:
            values[name] = str(value)
    file = read(INPUT, str(path))
    read(KIND, str(kind))
    for name, text in values.items():
        if not OPTIONS[name].flag:
            values[name] = read(OPTIONS[name], text)
    if extra:  # click's words for arguments left over once every option is read
        raise UsageError(f"Got unexpected extra argument{'s' if len(extra) > 1 else ''} ({' '.join(extra)})")
    return file, values


def read(option: PlotOption, text: str) -> Any:
    """``text`` as the command reads it after ``option``: converted by the option's click type, with a click
    option of its name so that a refusal names it; click's refusal becomes biasviz's UsageError with click's own
    message, the words the command prints after ``Error:``."""
    import click

    try:
        return option.type.convert(text, option.param(), None)
    except click.UsageError as exc:  # BadParameter and its kin: "Invalid value for '--dpi': ..."
        raise UsageError(exc.format_message()) from None


__all__ = ["OPTIONS", "checked", "command_values", "read"]
