"""What each option of ``biasviz plot`` that ``biasviz.plot`` also takes accepts, said once: its name on the command
line and the click type that reads its value. The command's decorators take their types from here, and
``biasviz.plot`` reads its keywords with the same types (:mod:`biasviz.notebook.options`), so that the two take the
same values and refuse the others in the same words, click's own. No matplotlib and no :mod:`biasviz.cli` here:
``biasviz --help`` reads this table, and ``biasviz.plot`` imports no part of the command line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from biasviz.common.param_types import NonEmptyPath
from biasviz.plotting.draw import DPI_RANGE, MAX_CELLS_RANGE, NORMALIZE, REDUCE
from biasviz.plotting.kinds import kind_names
from biasviz.plotting.style import VENUE_WIDTHS

F = TypeVar("F", bound=Callable[..., Any])


class KindChoice(click.Choice):
    """``--kind``'s choice: the rows of the kinds table, read when the option is checked or shown."""

    def __init__(self) -> None:
        super().__init__(kind_names())

    @property  # type: ignore[override]
    def choices(self) -> tuple[str, ...]:
        return kind_names()

    @choices.setter
    def choices(self, value: object) -> None:  # click's __init__ sets it; the table stays the source
        pass


@dataclass(frozen=True)
class PlotOption:
    """An option of ``biasviz plot``: its name (``--dpi``) and the click type its value is read with. A flag takes
    no value; its type is click's BOOL, the one click gives every flag."""

    name: str
    type: click.ParamType
    flag: bool = False

    def param(self) -> click.Option:
        """The option as click holds it, with no command made: what click's refusals name (``'--dpi'``)."""
        return click.Option([self.name], is_flag=True) if self.flag else click.Option([self.name], type=self.type)


#: ``--input``: the file drawn, never empty, never a folder
INPUT = PlotOption("--input", NonEmptyPath(dir_okay=False, path_type=Path))
#: ``--kind``: a row of the kinds table
KIND = PlotOption("--kind", KindChoice())
#: A keyword of ``biasviz.plot`` -> the option of ``biasviz plot`` it sets
OPTIONS: dict[str, PlotOption] = {
    "layer": PlotOption("--layer", click.INT),
    "sample": PlotOption("--sample", click.STRING),  # an index or 'mean': plot_checks.parse_sample reads the text
    "step": PlotOption("--step", click.INT),
    "normalize": PlotOption("--normalize", click.Choice(NORMALIZE)),
    "cmap": PlotOption("--cmap", click.STRING),
    "log": PlotOption("--log", click.BOOL, flag=True),
    "log_distance": PlotOption("--log-distance", click.BOOL, flag=True),
    "style": PlotOption("--style", click.Choice(list(VENUE_WIDTHS))),
    "width": PlotOption("--width", click.STRING),  # column, page or inches: style.with_width reads the text
    "dpi": PlotOption("--dpi", click.IntRange(*DPI_RANGE)),
    "reduce": PlotOption("--reduce", click.Choice(REDUCE)),
    "max_cells": PlotOption("--max-cells", click.IntRange(*MAX_CELLS_RANGE)),
}


def option(entry: PlotOption, *names: str, **attrs: Any) -> Callable[[F], F]:
    """``click.option`` for ``entry``, its name and type taken from this table so that the command cannot come to
    read the option otherwise than ``biasviz.plot`` does; ``names``: the parameter's name where the command's function
    calls it something else (``log_scale`` for ``--log``); ``attrs``: the rest (default, help)."""
    read = {"is_flag": True} if entry.flag else {"type": entry.type}
    return click.option(entry.name, *names, **read, **attrs)


__all__ = ["INPUT", "KIND", "OPTIONS", "KindChoice", "PlotOption", "option"]
