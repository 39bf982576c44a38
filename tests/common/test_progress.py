"""The progress printer: in a log, a line per tenth of a stage's work (never a line per unit, never a bar's carriage
returns); on a terminal, a bar that stays as the stage's line when it ends."""

from __future__ import annotations

import io
import re

import pytest

import biasviz.common.progress as progress
from biasviz.common.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_line_at_each_tenth_of_the_work() -> None:
    log = io.StringIO()
    with Progress(200, desc="train alibi", unit="step", stream=log) as bar:
        for _ in range(200):
            bar.update()
    lines = log.getvalue().splitlines()
    counts = [int(re.search(r" (\d+)/200 \[", line).group(1)) for line in lines]
    assert counts == [20, 40, 60, 80, 100, 120, 140, 160, 180, 200], lines
    assert all(line.startswith("train alibi: ") for line in lines) and "\r" not in log.getvalue()
    assert "100%" in lines[-1] and ("step/s" in lines[-1] or "s/step" in lines[-1])


def test_a_slow_tenth_still_shows_the_run_is_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = io.StringIO()
    bar = Progress(1000, desc="summarise", unit="block", stream=log, interval=60.0)
    for _ in range(5):  # 5 blocks, 50 s apart: under a tenth of the work, but minutes pass
        clock[0] += 50.0
        bar.update()
    assert len(log.getvalue().splitlines()) == 2  # one line a minute (at 100 s and 200 s)


def test_few_units_give_a_line_each_and_quiet_gives_none() -> None:
    log = io.StringIO()
    with Progress(3, desc="extract", unit="sample", stream=log) as bar:
        bar.update(2)
        bar.update(1)
    assert [line.split(": ", 1)[1].split()[:2] for line in log.getvalue().splitlines()] == [
        ["67%", "2/3"], ["100%", "3/3"]]  # fmt: skip
    quiet = io.StringIO()
    with Progress(3, desc="extract", unit="sample", stream=quiet, show=False) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""


def test_a_terminal_keeps_each_stages_finished_bar() -> None:
    term = _Terminal()
    for name in ("train alibi", "extract"):
        with Progress(4, desc=name, unit="step", stream=term) as bar:
            for _ in range(4):
                bar.update()
    kept = [part.split("\r")[-1] for part in term.getvalue().split("\n") if part.split("\r")[-1].strip()]
    assert len(kept) == 2 and kept[0].startswith("train alibi: 100%") and kept[1].startswith("extract: 100%"), kept


def test_lines_on_a_terminal_when_steps_run_side_by_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """make figures runs its steps in parallel: BIASVIZ_PROGRESS=lines gives lines (no carriage returns) even on a
    terminal, each naming the file its step makes (control characters in the name shown as '?')."""
    monkeypatch.setenv("BIASVIZ_PROGRESS", "lines")
    monkeypatch.setenv("BIASVIZ_PROGRESS_FOR", "data/alibi-long.h5\x1b[2J")
    term = _Terminal()
    with Progress(10, desc="summarise", unit="block", stream=term) as bar:
        for _ in range(10):
            bar.update()
    lines = term.getvalue().splitlines()
    assert len(lines) == 10 and "\r" not in term.getvalue() and "\x1b" not in term.getvalue()
    assert all(line.startswith("data/alibi-long.h5?[2J: summarise: ") for line in lines), lines


def test_a_bar_where_lines_are_not_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIASVIZ_PROGRESS", "auto")
    term = _Terminal()
    with Progress(10, desc="summarise", unit="block", stream=term) as bar:
        bar.update(10)
    assert "\r" in term.getvalue()


def test_an_unknown_progress_mode_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from biasviz.common.errors import BiasvizError

    monkeypatch.setenv("BIASVIZ_PROGRESS", "fancy")
    with pytest.raises(BiasvizError, match="BIASVIZ_PROGRESS='fancy' is not one of auto, bar, lines"):
        Progress(10, desc="x", unit="step", stream=io.StringIO())
