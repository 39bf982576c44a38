"""The table of ``biasviz plot``'s options (:mod:`biasviz.plotting.options`) is what both callers read: the command's
decorators take each option's type from it. That ``biasviz.plot`` refuses what the command refuses, in its words, is
tests/notebook/test_options.py."""

from __future__ import annotations

import click

from biasviz.plotting.options import INPUT, KIND, OPTIONS


def test_the_command_reads_each_option_with_the_tables_type() -> None:
    """Same name, same type object: the command's decorators took it from the table, not from a copy."""
    from biasviz.cli.plot_cmd import plot

    params = {p.opts[0]: p for p in plot.params if isinstance(p, click.Option)}
    for option in (INPUT, KIND, *OPTIONS.values()):
        param = params[option.name]
        assert param.is_flag == option.flag, option.name
        assert param.type is option.type or option.flag and isinstance(param.type, click.types.BoolParamType)
