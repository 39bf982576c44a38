"""Options shared by several commands, and ``--config FILE.toml`` support for all of them."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from biasviz.common.param_types import NonEmptyPath  # here too: the commands' path type, by its old name

F = TypeVar("F", bound=Callable[..., Any])


def load_toml(path: str | Path) -> dict[str, Any]:
    """A config file's TOML data; a file that cannot be read or parsed is a usage error naming it."""
    from biasviz.common.errors import BiasvizError
    from biasviz.common.inputs import read_text

    p = Path(path)
    if not p.exists():
        raise click.BadParameter(f"config file {p} does not exist", param_hint="--config")
    try:
        return tomllib.loads(read_text(p, "TOML file"))
    except BiasvizError as exc:  # not a regular file, unreadable, not UTF-8
        raise click.BadParameter(str(exc), param_hint="--config") from None
    except tomllib.TOMLDecodeError as exc:
        raise click.BadParameter(f"{p} is not valid TOML: {exc}", param_hint="--config") from None
    except RecursionError:  # Python's TOML parser recurses once per level of nesting
        raise click.BadParameter(f"{p} is nested too deeply to be a config (arrays or tables inside one another "
                                 "thousands of levels deep)", param_hint="--config") from None  # fmt: skip


def read_config(path: str | Path, command: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """Defaults for ``command`` from a TOML file: its top-level keys, then its ``[command]`` table.

    Keys may use ``-`` or ``_``. A table for another command is ignored, so one file can drive
    train, extract and plot (see ``configs/``). Returns ``{"shared": ..., "section": ...}``.
    """
    p = Path(path)
    data = load_toml(p) if data is None else data
    shared = _one_spelling({k: v for k, v in data.items() if not isinstance(v, dict)}, "the top level", p)
    section = data.get(command, {})
    if not isinstance(section, dict):
        raise click.BadParameter(f"[{command}] in {p} must be a table", param_hint="--config")
    return {"shared": shared, "section": _one_spelling(section, f"[{command}]", p)}


def _one_spelling(table: dict[str, Any], where: str, file: Path,
                  same: Callable[[str], str] | None = None) -> dict[str, Any]:  # fmt: skip
    """``table`` with its keys spelled with ``_``; two keys that name one option (``seq-len`` and ``seq_len``, or
    an option's two names: ``same`` gives the option of a key) are refused, not one of them kept in silence."""
    out: dict[str, Any] = {}
    first: dict[str, str] = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        option = same(name) if same is not None else name
        if option in first:
            raise click.BadParameter(f"'{first[option]}' and '{key}' in {where} of {file} set the same option; "
                                     "keep one of them", param_hint="--config")  # fmt: skip
        first[option] = key
        out[name] = value
    return out


CONFIG_META = "biasviz.config"


def with_config(*inputs: str | Path | None) -> tuple[str | Path | None, ...]:
    """``inputs`` and the running command's ``--config`` file: the files its outputs must not replace."""
    ctx = click.get_current_context(silent=True)
    return (*inputs, ctx.meta.get(CONFIG_META) if ctx is not None else None)


def _load_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    ctx.meta[CONFIG_META] = value  # an input like any other: no output may replace it
    data = load_toml(value)
    parts = read_config(value, ctx.info_name or "", data)
    # keys are spelled like the options (`format` for --format), whatever the parameter is called inside
    known = _option_keys(ctx.command)
    unknown = sorted(set(parts["section"]) - set(known))
    if unknown:
        raise click.BadParameter(
            f"unknown key(s) {', '.join(unknown)} in [{ctx.info_name}] of {value}", param_hint="--config"
        )
    _check_other_commands(ctx, data, value)
    # an option's other names (`--out` and `-o`) are one key: given twice in one table is an error
    for part, where in (("shared", "the top level"), ("section", f"[{ctx.info_name}]")):
        _one_spelling({k: v for k, v in parts[part].items() if k in known}, where, Path(value), known.__getitem__)
    # top-level keys (like `scheme`) apply to every command that has such an option
    given = {k: v for k, v in parts["shared"].items() if k in known} | parts["section"]
    params = {p.name: p for p in ctx.command.params}
    for key, v in given.items():
        _check_type(params[known[key]], key, v, value)
    defaults = {known[k]: v for k, v in given.items()}
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _option_keys(command: click.Command) -> dict[str, str]:
    """The config keys ``command`` reads (its options' names and spellings, ``_`` for ``-``) -> the parameter set."""
    keys: dict[str, str] = {}
    for param in command.params:
        if isinstance(param, click.Option) and param.name:
            keys[param.name] = param.name
            keys.update({opt.lstrip("-").replace("-", "_"): param.name for opt in param.opts})
    return keys


def _check_other_commands(ctx: click.Context, data: dict[str, Any], file: str) -> None:
    """Tables must name a command, top-level keys an option of some command: a typo is an error, not ignored."""
    import difflib

    from biasviz.cli import cli

    commands = {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)}
    tables = sorted(k for k, v in data.items() if isinstance(v, dict) and k not in commands)
    if tables:
        raise click.BadParameter(f"unknown table [{tables[0]}] in {file}; known tables: {', '.join(sorted(commands))}",
                                 param_hint="--config")  # fmt: skip
    known = set().union(*(_option_keys(c).keys() for c in commands.values() if c is not None))
    for key in (k.replace("-", "_") for k, v in data.items() if not isinstance(v, dict)):
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise click.BadParameter(f"unknown key '{key}' in {file}{hint}; known keys: {', '.join(sorted(known))}",
                                     param_hint="--config")  # fmt: skip


def _toml(value: object) -> str:
    """A value as TOML spells it (true, 2.7, 'text'), for messages."""
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def _check_type(param: click.Parameter, key: str, value: object, file: str) -> None:
    """A config value must have its option's type: 2.7 is no sample count, 1 no flag, '2' no batch size."""
    kind = param.type
    if getattr(param, "is_flag", False) or isinstance(kind, click.types.BoolParamType):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(kind, click.types.IntParamType):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(kind, click.types.FloatParamType):
        ok, want = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
    elif isinstance(kind, (click.Choice, click.Path)):
        ok, want = isinstance(value, str), "text"
    else:  # free text options take text, and numbers where they are natural (layer = -1, sample = 0)
        allowed = (str, int, dict) if param.name == "scheme_options" else (str, int)
        ok, want = isinstance(value, allowed) and not isinstance(value, bool), "text"
    if not ok:
        raise click.BadParameter(f"{key} = {_toml(value)} in {file}: {param.opts[0]} must be {want}",
                                 param_hint="--config")  # fmt: skip


def checked(check: Callable[[Any], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A Click callback running one of :mod:`biasviz.common.checks` (on command-line and config values alike)."""

    def callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        from biasviz.common.errors import BiasvizError, UsageError

        if value is None:
            return value
        try:
            return check(value)
        except BiasvizError as exc:
            raise UsageError(str(exc)) from None

    return callback


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
    from biasviz.common.atomic import write_text

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
    from biasviz.plotting.options import OPTIONS, option
    from biasviz.plotting.style import DEFAULT_STYLE

    options = [
        click.option(
            "--format", "formats_text", default="pdf,png", show_default=True, help="Comma list of pdf, png, svg."
        ),
        option(
            OPTIONS["style"], default=DEFAULT_STYLE, show_default=True,
            help="Printed width: neurips/iclr 5.5 in, acl 6.3 in, icml 6.75 in, *-column one column.",
        ),
        option(
            OPTIONS["width"], default=None, metavar="column|page|INCHES",
            help="Printed width: the style's one column, its full text width, or inches (2-10) [default: the style's].",
        ),
        option(OPTIONS["dpi"], default=200, show_default=True, help="PNG resolution."),
        click.option(
            "--out-dir", type=NonEmptyPath(file_okay=False, path_type=Path), default=Path("figures"), show_default=True,
            help="Folder for the figures (created if missing).",
        ),
    ]  # fmt: skip
    for decorate in reversed(options):
        f = decorate(f)
    return f


def seed_option(f: F) -> F:
    from biasviz.common.checks import check_seed

    return click.option("--seed", default=0, show_default=True, type=int, callback=checked(check_seed),
                        help="Random seed, 0 to 2^63 - 1 (reproducible runs).")(f)  # fmt: skip


def device_map_options(f: F) -> F:
    """``--device-map``, ``--max-memory``, ``--offload-folder``: a model larger than a device, spread by accelerate."""
    options = [
        click.option(
            "--device-map", default=None, metavar="auto|balanced|sequential|FILE.json",
            help="Spread a transformers model over the GPUs, host memory and the disk (accelerate: "
            "pip install 'biasviz[big]'): a strategy, or a JSON file of module names to cpu, disk or a GPU index. "
            "The model stays where the map puts it; inputs go where its first layer runs.",
        ),
        click.option(
            "--max-memory", default=None, metavar="DEVICE=SIZE,...",
            help="With --device-map auto|balanced|sequential: the most each device may hold, e.g. 0=70GiB,cpu=100GiB "
            "(what does not fit goes to the disk).",
        ),
        click.option(
            "--offload-folder", default=None, type=NonEmptyPath(),
            help="With --device-map: where weights offloaded to the disk may be written [default: a temporary folder, "
            "removed afterwards].",
        ),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f
