"""The ``biasviz`` command: one Click group; each command lives in its own module."""

from __future__ import annotations

import contextlib
import gc
import sys
import traceback
import warnings
from collections.abc import Iterator

import click

from biasviz.common.ending import ignore_ending, restore, unwind_on_ending
from biasviz.common.errors import BiasvizError, os_error_message
from biasviz.common.out_of_memory import out_of_memory_message, ran_out
from biasviz.common.terminal import say
from biasviz.common.threads import passive_waits
from biasviz.common.version import __version__

# Command modules, imported lazily so that `biasviz --help` stays fast (torch is slow to import).
_COMMANDS = {
    "schemes": ("biasviz.cli.schemes_cmd", "schemes"),
    "train": ("biasviz.cli.train_cmd", "train"),
    "extract": ("biasviz.cli.extract_cmd", "extract"),
    "info": ("biasviz.cli.info_cmd", "info"),
    "plot": ("biasviz.cli.plot_cmd", "plot"),
    "diagnose": ("biasviz.cli.diagnose_cmd", "diagnose"),
    "explore": ("biasviz.cli.explore_cmd", "explore"),
}


class _LazyGroup(click.Group):
    """A group that imports a command's module only when that command is used or listed."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in _COMMANDS if self._load(name) is not None]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return self._load(cmd_name)

    @staticmethod
    def _load(name: str) -> click.Command | None:
        if name not in _COMMANDS:
            return None
        module_name, attr = _COMMANDS[name]
        import importlib

        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:  # command not written yet
                return None
            raise
        return getattr(module, attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="biasviz")
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Extract, store, plot and explore the positional attention biases of transformer models (any PyTorch model
    whose attention calls SDPA or flex_attention, biasviz's own GPT-2 variants, transformers checkpoints)."""
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    if ctx.invoked_subcommand in _DRAWING:
        from biasviz.common.settings import check_plot_backend

        check_plot_backend()


_DRAWING = ("plot", "diagnose", "explore")  # the commands that import matplotlib


def _quiet_libraries() -> None:
    """Silence transformers' own progress bars and notices; biasviz reports progress itself."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a hub
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


_SCRIPT = False  # running as the installed script (not main(argv) from Python, whose signal handlers are kept)


def output_in_place() -> None:
    """The command's output is complete and in place: a Ctrl-C or SIGTERM from here on has nothing left to stop and
    must not report the run as interrupted (it would claim the old file was kept). The installed script only."""
    if _SCRIPT:
        ignore_ending()


def in_place_when_published() -> None:
    """The one file a command writes counts as in place the moment it lands (:func:`output_in_place` runs right
    after the move, signals held back across both): no window in which a late Ctrl-C reports the old file kept."""
    from biasviz.common.atomic import when_published

    when_published(output_in_place)


@contextlib.contextmanager
def lasting_objects() -> Iterator[None]:
    """Imports and a model's load in the installed script: no garbage collection while they run, and what they made
    is left out of every later collection (``gc.freeze``). From Python (``main(argv)``) the caller's collector is
    left alone.

    Importing torch and transformers makes some 500,000 objects that live as long as the process; each full
    collection during the imports traced all made so far again, 0.5 s of an extract's start. What they leave
    unreachable (about 10,000 objects, 9 MB) is not collected.
    """
    if not _SCRIPT or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI and turn user errors into one ``Error:`` line and an exit code."""
    global _SCRIPT
    _SCRIPT = argv is None
    try:
        _main(argv)
    except SystemExit as exc:
        if argv is None:  # the installed script: a library that failed to write must not crash the exit
            _exit_past_damaged_hdf5(exc.code)
        raise
    finally:
        if argv is None:  # the interpreter's collection at exit traced every object once more: 0.7 s after torch
            gc.freeze()
    if argv is None:  # done and on disk: a Ctrl-C while the interpreter shuts down has nothing left to stop
        ignore_ending()


def _exit_past_damaged_hdf5(code: object) -> None:
    """End the process now if an HDF5 write failed while an object was freed (a full disk, a file-size limit).

    The library's exit handlers would then flush the failed file again and can crash the process after the
    ``Error:`` line; the output was already removed, so there is nothing left for them to do.
    """
    from biasviz.store.failures import STATE

    if STATE.damaged:
        import os

        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code if isinstance(code, int) else 1)


def _main(argv: list[str] | None) -> None:
    from biasviz.common.names import escaping_output

    with escaping_output():  # a message quoting a name the terminal cannot show is printed escaped, not a crash
        _command(argv)


def _command(argv: list[str] | None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    _quiet_libraries()
    passive_waits()  # before torch loads: its OpenMP threads then sleep rather than spin while they wait
    previous = unwind_on_ending()  # SIGTERM and SIGHUP unwind like Ctrl-C: clean-up runs, no partial output
    previous_hook, sys.unraisablehook = sys.unraisablehook, _interrupts_reach_main
    previous_show, warnings.showwarning = warnings.showwarning, _one_line_warning
    try:
        cli.main(args=args, prog_name="biasviz", standalone_mode=False)
    except click.exceptions.Abort as exc:  # Click's word for a Ctrl-C; a sweep's says what it kept
        said = str(exc.__cause__) if isinstance(exc.__cause__, KeyboardInterrupt) else ""
        say("Error", said or "interrupted.")
        sys.exit(130)
    except click.ClickException as exc:  # usage errors: Click's own message, one line
        if debug:
            traceback.print_exc()
        msg = exc.format_message().splitlines()[0] if exc.format_message() else str(exc)
        ctx_hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            ctx_hint = f" (see '{exc.ctx.command_path} --help')"
        say("Error", f"{msg}{ctx_hint}")
        sys.exit(exc.exit_code)
    except BiasvizError as exc:
        if debug:
            traceback.print_exc()
        say("Error", str(exc))
        sys.exit(exc.exit_code)
    except OSError as exc:  # the environment refused a read or write (permissions, full disk): say which, and why
        if debug:
            traceback.print_exc()
        say("Error", os_error_message(exc, action="access" if exc.filename else "write"))
        sys.exit(1)
    except KeyboardInterrupt as exc:  # a sweep says what it kept
        say("Error", str(exc) or "interrupted; no partial output was left behind.")
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except Exception as exc:  # a library that turned a Ctrl-C into its own error (h5py inside a type conversion)
        if not _from_interrupt(exc):
            found = ran_out(exc)  # memory that ran out part-way: said in one line, as any other error the user can fix
            if found is None:
                raise
            if debug:
                traceback.print_exc()
            say("Error", out_of_memory_message(found, next((a for a in args if a in _COMMANDS), None), args))
            sys.exit(1)
        if debug:
            traceback.print_exc()
        say("Error", "interrupted; no partial output was left behind.")
        sys.exit(130)
    finally:
        sys.unraisablehook = previous_hook
        warnings.showwarning = previous_show
        restore(previous)


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      file: object = None, line: str | None = None) -> None:  # fmt: skip
    """A library's warning as the user reads it: one ``Warning:`` line, not a file name and a line of source code.

    Under torchrun only process 0 says it (every process would say the same).
    """
    import os

    if os.environ.get("RANK", "0") != "0":
        return
    text = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    say("Warning", text or category.__name__)


def _from_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` was raised while handling a Ctrl-C or SIGTERM: h5py, interrupted inside one of its
    conversions, raises a TypeError of its own with the KeyboardInterrupt as its context."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, KeyboardInterrupt):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _interrupts_reach_main(unraisable: object) -> None:
    """A Ctrl-C (or SIGTERM) that lands inside a finaliser (a garbage-collected tensor's weakref callback,
    say) is one Python cannot raise there. Instead of printing it as an ignored exception with a traceback,
    remember it: the long loops (:func:`biasviz.common.errors.check_interrupted`) raise it at their next step,
    where the command unwinds and cleans up as usual."""
    if isinstance(getattr(unraisable, "exc_value", None), KeyboardInterrupt):
        from biasviz.common.errors import note_interrupt

        note_interrupt()
        return
    sys.__unraisablehook__(unraisable)  # type: ignore[arg-type]


__all__ = ["cli", "main"]
