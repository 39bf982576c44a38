"""The path type of the commands and the Python API (:mod:`biasviz.common.param_types`): an empty or blank value is
refused in one message, anything else is checked as click's own ``click.Path`` checks it."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from biasviz.common.param_types import NonEmptyPath


def command(kind: click.ParamType) -> click.Command:
    @click.command()
    @click.option("--out", type=kind)
    def show(out: object) -> None:
        click.echo(f"out={out!r}")

    return show


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_an_empty_or_blank_path_is_refused(value: str) -> None:
    result = CliRunner().invoke(command(NonEmptyPath()), ["--out", value])
    assert result.exit_code == 2
    assert "Invalid value for '--out': is empty: give a path, or leave the option out for its default" in result.output
    with pytest.raises(click.BadParameter, match="is empty"):
        NonEmptyPath().convert(value, None, None)  # the Python API's call, with no command around it


def test_a_path_is_let_through_as_click_path_would() -> None:
    result = CliRunner().invoke(command(NonEmptyPath(path_type=Path)), ["--out", "a/b.h5"])
    assert result.exit_code == 0 and result.output == f"out={Path('a/b.h5')!r}\n"
    assert NonEmptyPath().convert(" x", None, None) == " x"  # blank only around a name: a name
    result = CliRunner().invoke(command(NonEmptyPath()), [])
    assert result.exit_code == 0 and result.output == "out=None\n"  # left out: the default


def test_click_paths_own_checks_still_apply(tmp_path: Path) -> None:
    missing = tmp_path / "missing.h5"
    result = CliRunner().invoke(command(NonEmptyPath(exists=True)), ["--out", str(missing)])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert issubclass(NonEmptyPath, click.Path)
