"""``biasviz.plot``'s keywords (:mod:`biasviz.notebook.options`) read with the table of ``biasviz plot``'s options
(:mod:`biasviz.plotting.options`): a value the command refuses, ``biasviz.plot`` refuses in the words ``biasviz plot``
prints, compared with the command's own output (click's CliRunner), never with words copied from the code. The bad
values are made from each option's type, so an option added to the table gets its cases, and one whose type allows no
bad value fails the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

import biasviz
from biasviz.common.errors import UsageError
from biasviz.common.param_types import NonEmptyPath
from biasviz.notebook.options import command_values
from biasviz.plotting.options import INPUT, KIND, OPTIONS, PlotOption

FOLDER = "<a folder>"  # stands for the test's tmp_path, known only when the test runs
#: keywords biasviz.plot reads as indices first (biasviz.common.arguments): text or True is its own TypeError there
INDEXED = {"layer", "step", "sample"}


def bad_values(option: PlotOption) -> Iterator[Any]:
    """Values the command refuses for ``option``, made from its click type."""
    if option.flag:
        yield "yes"  # `--log yes`: the flag, and an argument the command has no place for
        return
    yield True  # `--cmap` and nothing after it
    kind = option.type
    if isinstance(kind, click.types.IntParamType):
        yield from ("abc", "1.5", "")
    if isinstance(kind, click.IntRange):
        yield from (kind.min - 1, kind.max + 1)  # type: ignore[operator]
    if isinstance(kind, click.Choice):
        yield from ("no-such-choice", str(kind.choices[0]).upper() + "!")
    if isinstance(kind, NonEmptyPath):
        yield from ("", "   ", FOLDER)


def cases() -> list[tuple[str, Any]]:
    """(keyword, value) for every option of the table and each bad value; ``input`` and ``kind`` for the path and
    the kind ``biasviz.plot`` takes first."""
    table = {"input": INPUT, "kind": KIND, **OPTIONS}
    found = [
        (name, value)
        for name, option in table.items()
        for value in bad_values(option)
        if not (value is True and name in ("input", "kind"))
    ]  # Python's arguments, not keywords: no True
    assert {name for name, _ in found} == set(table)
    return found


def command_error(args: list[str]) -> str:
    """The message of the ``Error:`` line ``biasviz plot ARGS`` prints."""
    from biasviz.cli import cli

    result = CliRunner().invoke(cli, ["plot", *args])
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert result.exit_code == 2 and len(errors) == 1, result.output
    return errors[0].removeprefix("Error: ")


def args_of(name: str, value: Any, file: str) -> list[str]:
    """The command line for ``keyword=value``: the input and kind first, then the option (its value left out where
    it is True: an option with nothing after it)."""
    path, kind, extra = file, "bias", []
    if name == "input":
        path = value
    elif name == "kind":
        kind = value
    else:
        extra = [OPTIONS[name].name] + ([] if value is True else [str(value)])
    return ["--scheme", "cable", "--input", str(path), "--kind", str(kind), *extra]


@pytest.mark.parametrize(("name", "value"), cases(), ids=repr)
def test_a_refused_value_is_refused_in_the_words_the_command_prints(name: str, value: Any, tmp_path: Path) -> None:
    file = str(tmp_path / "cable.h5")  # never read: every case is refused before a file is opened
    value = str(tmp_path) if value == FOLDER else value
    want = command_error(args_of(name, value, file))
    path, kind = (value, "bias") if name == "input" else (file, value) if name == "kind" else (file, "bias")
    options = {} if name in ("input", "kind") else {name: value}
    with pytest.raises(UsageError) as read:
        command_values(path, kind, options)
    assert str(read.value) == want
    if name in INDEXED:
        return
    with pytest.raises(UsageError) as plotted:
        biasviz.plot(path, kind, scheme="cable", **options)
    assert str(plotted.value) == want
