"""The signals that end a run (:mod:`biasviz.common.ending`): SIGINT, SIGTERM and SIGHUP each unwind like Ctrl-C
(a KeyboardInterrupt, so clean-up runs), a signal the process was started with ignored stays ignored, the
handlers replaced are given back, and off the main thread nothing is touched. The handlers installed are called
directly here, never sent as signals, so that a broken module fails the test instead of ending pytest."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from biasviz.common.ending import ENDING, ignore_ending, restore, unwind_on_ending

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def own_handler(_signum: int, _frame: object) -> None:
    """A handler of the caller's, that the module must give back."""


@pytest.fixture
def handlers() -> Iterator[None]:
    """The three handlers as they were before the test, set back after it whatever it did."""
    saved = {s: signal.getsignal(s) for s in SIGNALS}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def test_the_ending_signals_are_interrupt_terminate_and_hangup() -> None:
    assert set(ENDING) == set(SIGNALS)


def test_each_signal_then_unwinds_like_ctrl_c(handlers: None) -> None:
    for s in SIGNALS:
        signal.signal(s, own_handler)
    previous = unwind_on_ending()
    assert previous == dict.fromkeys(SIGNALS, own_handler)
    for s in SIGNALS:
        installed: Any = signal.getsignal(s)
        assert callable(installed) and installed is not own_handler, s
        with pytest.raises(KeyboardInterrupt):
            installed(s, None)


def test_restore_gives_back_what_was_replaced(handlers: None) -> None:
    for s in SIGNALS:
        signal.signal(s, own_handler)
    restore(unwind_on_ending())
    assert [signal.getsignal(s) for s in SIGNALS] == [own_handler] * 3


def test_a_signal_ignored_by_whoever_started_the_process_stays_ignored(handlers: None) -> None:
    """``nohup`` starts a command with SIGHUP ignored: closing the terminal must still not stop it."""
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, own_handler)
    previous = unwind_on_ending()
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN and signal.SIGHUP not in previous
    assert signal.SIGTERM in previous


def test_pythons_own_ctrl_c_handler_is_left_in_place(handlers: None) -> None:
    """It already raises KeyboardInterrupt: nothing to replace, nothing to give back."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = unwind_on_ending()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and signal.SIGINT not in previous


def test_off_the_main_thread_nothing_is_set(handlers: None) -> None:
    for s in SIGNALS:
        signal.signal(s, own_handler)
    got: list[dict[signal.Signals, Any]] = []
    thread = threading.Thread(target=lambda: got.append(unwind_on_ending()))
    thread.start()
    thread.join()
    assert got == [{}]
    assert [signal.getsignal(s) for s in SIGNALS] == [own_handler] * 3


def test_ignore_ending_ignores_all_three(handlers: None) -> None:
    unwind_on_ending()
    ignore_ending()
    assert [signal.getsignal(s) for s in SIGNALS] == [signal.SIG_IGN] * 3
