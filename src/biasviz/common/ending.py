"""The signals that end a run, handled alike: Ctrl-C (SIGINT), ``kill`` or a scheduler's limit (SIGTERM), a
closed terminal or SSH session (SIGHUP).

Commands write to temporary files and move them into place; each of these signals unwinds the command like a
Ctrl-C (a KeyboardInterrupt), so its clean-up removes the temporary file and releases the lock. A signal the
process was started with ignored (``nohup`` ignores SIGHUP) stays ignored.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

ENDING: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _unwind(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def unwind_on_ending() -> dict[signal.Signals, Any]:
    """Make every signal of :data:`ENDING` unwind like Ctrl-C; returns the handlers it replaced (to give back
    with :func:`restore`). Off the main thread nothing can be set: returns {}."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous: dict[signal.Signals, Any] = {}
    for s in ENDING:
        current = signal.getsignal(s)
        if current is signal.SIG_IGN or (s == signal.SIGINT and current is signal.default_int_handler):
            continue  # ignored by whoever started us; Python's own Ctrl-C handler already unwinds
        previous[s] = signal.signal(s, _unwind)
    return previous


def restore(previous: dict[signal.Signals, Any]) -> None:
    """Give back the handlers :func:`unwind_on_ending` replaced."""
    for s, handler in previous.items():
        signal.signal(s, handler)


def ignore_ending() -> None:
    """From here on no signal of :data:`ENDING` interrupts: the output is in place, nothing is left to stop."""
    for s in ENDING:
        signal.signal(s, signal.SIG_IGN)


__all__ = ["ENDING", "ignore_ending", "restore", "unwind_on_ending"]
