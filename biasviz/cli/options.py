"""Options shared by several commands, and ``--config FILE.toml`` support for all of them."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def read_config(path: str | Path, command: str) -> dict[str, Any]:
    """Defaults for ``command`` from a TOML file: its top-level keys, then its ``[command]`` table.

    Keys may use ``-`` or ``_``. A table for another command is ignored, so one file can drive
    train, extract and plot (see ``configs/``). Returns ``{"shared": ..., "section": ...}``.
    """
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise click.BadParameter(f"config file {p} does not exist", param_hint="--config") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{p} is not valid TOML: {exc}", param_hint="--config") from None
    except OSError as exc:
        raise click.BadParameter(f"cannot read {p}: {exc.strerror}", param_hint="--config") from None
    shared = {k.replace("-", "_"): v for k, v in data.items() if not isinstance(v, dict)}
    section = data.get(command, {})
    if not isinstance(section, dict):
        raise click.BadParameter(f"[{command}] in {p} must be a table", param_hint="--config")
    return {"shared": shared, "section": {k.replace("-", "_"): v for k, v in section.items()}}


def _load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    parts = read_config(value, ctx.info_name or "")
    # keys are spelled like the options (`format` for --format), whatever the parameter is called inside
    known: dict[str, str] = {}
    for param in ctx.command.params:
        if param.name and isinstance(param, click.Option):
            known[param.name] = param.name
            for opt in param.opts:
                known[opt.lstrip("-").replace("-", "_")] = param.name
    unknown = sorted(set(parts["section"]) - set(known))
    if unknown:
        raise click.BadParameter(
            f"unknown key(s) {', '.join(unknown)} in [{ctx.info_name}] of {value}", param_hint="--config"
        )
    # top-level keys (like `scheme`) apply to every command that has such an option
    defaults = {known[k]: v for k, v in parts["shared"].items() if k in known}
    defaults.update({known[k]: v for k, v in parts["section"].items()})
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def write_stage(config: str | Path, command: str, out: str | Path) -> bool:
    """Write the part of ``config`` that ``command`` reads to ``out``, only if it changed.

    ``make`` uses these per-stage files as dependencies, so that editing ``[plot]`` in a config
    re-plots without retraining. Returns True when ``out`` was (re)written.
    """
    import json

    parts = read_config(config, command)
    text = json.dumps(parts, indent=1, sort_keys=True, default=str) + "\n"
    target = Path(out)
    if target.exists() and target.read_text() == text:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    from biasviz.atomic import write_text

    write_text(target, text)
    return True


if __name__ == "__main__":  # python -m biasviz.cli.options CONFIG COMMAND OUT  (used by the Makefile)
    import sys

    write_stage(*sys.argv[1:4])


def config_option(f: F) -> F:
    """``--config FILE.toml``: option defaults from a file; options given on the command line win."""
    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        is_eager=True,
        expose_value=False,
        callback=_load_config,
        help="TOML file with option defaults (top-level keys and a table named after this command).",
    )(f)


def device_option(f: F) -> F:
    return click.option(
        "--device", default="auto", show_default=True, help="auto (CUDA when present), cpu, cuda or cuda:K."
    )(f)


def figure_output_options(f: F) -> F:
    """``--format``, ``--style``, ``--dpi`` and ``--out-dir``: how and where figures are written."""
    from biasviz.plotting.style import DEFAULT_STYLE, VENUE_WIDTHS

    options = [
        click.option(
            "--format", "formats_text", default="pdf,png", show_default=True, help="Comma list of pdf, png, svg."
        ),
        click.option(
            "--style", type=click.Choice(list(VENUE_WIDTHS)), default=DEFAULT_STYLE, show_default=True,
            help="Printed width: neurips/iclr 5.5 in, acl 6.3 in, icml 6.75 in, *-column one column.",
        ),
        click.option("--dpi", type=click.IntRange(50, 1200), default=200, show_default=True, help="PNG resolution."),
        click.option(
            "--out-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("figures"), show_default=True,
            help="Folder for the figures (created if missing).",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def seed_option(f: F) -> F:
    return click.option("--seed", default=0, show_default=True, type=int, help="Random seed (reproducible runs).")(f)
