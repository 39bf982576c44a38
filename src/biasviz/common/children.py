"""Starting biasviz's own child processes, isolated from the folder they run in and the user's import settings.

``python -m MODULE`` puts the current folder first on the import path, and PYTHONPATH, PYTHONHOME,
PYTHONSTARTUP or the user's site folder change what a child imports: a ``h5py.py`` or a ``biasviz/`` folder
where a user runs ``info`` would run as code. Every child biasviz starts goes through :func:`run_module`: the
same interpreter in isolated mode (``-I``: no PYTHON* variable, no user site, no current folder on the path),
with the PYTHON* variables removed from its environment too, and one folder added to its import path: the one
this process imported biasviz from (an editable install or a PYTHONPATH this process was given), resolved here
rather than read from the environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

# the child: make this process's biasviz importable first, then run MODULE as ``python -m`` would
_BOOT = "import runpy, sys; sys.path[:0] = {paths!r}; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"


def biasviz_root() -> str:
    """The folder holding the ``biasviz`` package this process runs (``.../src`` of an editable install): this
    module's package's parent."""
    return str(Path(__file__).resolve().parents[2])


def _import_paths() -> list[str]:
    """What the isolated child needs on its path beyond the interpreter's own: biasviz's folder, unless that is
    already one of the interpreter's (an ordinary install), so that nothing there can shadow the standard library."""
    own = {str(Path(p).resolve()) for key in ("stdlib", "platstdlib", "purelib", "platlib")
           if (p := sysconfig.get_paths().get(key))}  # fmt: skip
    root = biasviz_root()
    return [] if root in own else [root]


def child_environment() -> dict[str, str]:
    """This process's environment without the variables that change what Python imports or runs at start."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def child_argv(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m MODULE ARGS`` isolated (see the module's docstring)."""
    return [sys.executable, "-I", "-c", _BOOT.format(paths=_import_paths(), module=module), *args]


def run_module(module: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run biasviz's ``module`` as a child, isolated, with no input; its output captured as text.

    A child that outlives ``timeout`` seconds raises :class:`subprocess.TimeoutExpired` (it is killed).
    """
    return subprocess.run(child_argv(module, *args), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=child_environment())  # fmt: skip
