"""Click parameter types that more than one caller reads: the commands' options, and the Python API that takes the
same values (``biasviz.plot``), which must refuse what the commands refuse in their words without importing
:mod:`biasviz.cli`."""

from __future__ import annotations

from typing import Any

import click


class NonEmptyPath(click.Path):
    """A path option that refuses an empty value (``--out ""``, or ``out = ""`` in a config): empty would
    otherwise read as the current folder or, for an output, silently as the default path."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("is empty: give a path, or leave the option out for its default", param, ctx)
        return super().convert(value, param, ctx)


__all__ = ["NonEmptyPath"]
