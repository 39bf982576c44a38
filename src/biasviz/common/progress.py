"""Progress of long runs: a bar on a terminal; in a log, a line at each tenth of the work.

A run at 16K positions can take minutes per sample. On a terminal tqdm draws a bar with rate and time
left, and leaves it as the stage's line when the stage ends. In a log (a redirected stderr, CI, a Slurm job,
``make figures`` piped to a file) a bar's carriage returns are unreadable, so plain lines are written
instead, with the same numbers: one each time another tenth of its work is done, and one at least every
``interval`` seconds in between, so that a slow tenth still shows the run is alive. A stage of any length
thus writes about ten lines, never hundreds, and one that fails at once none before its ``Error:`` line.
``--quiet`` silences both. ``BIASVIZ_PROGRESS=lines`` asks for lines on a terminal too (``make figures`` runs
its steps side by side), each starting with ``BIASVIZ_PROGRESS_FOR`` where that names what the step makes.
"""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any, TextIO

from biasviz.common.settings import progress_label, progress_mode

#: In a log: the longest time without a line while a stage runs.
HEARTBEAT_SECONDS = 60.0
#: In a log: a line each time another 1/STEPS of the stage's work is done.
STEPS = 10


class Progress:
    """Counts ``total`` units of work (blocks of query rows x samples x layers, or samples).

    ``show``: True or False, or None for "a bar on a terminal, lines at each tenth otherwise". ``desc`` can be
    changed as the run moves from one phase to the next (it is part of every line).
    """

    def __init__(self, total: int, *, desc: str, unit: str, show: bool | None = None, stream: TextIO | None = None,
                 interval: float | None = None) -> None:  # fmt: skip
        self.stream = sys.stderr if stream is None else stream
        self.total, self.unit, self.desc, self.n = max(int(total), 0), unit, desc, 0
        self.interval = HEARTBEAT_SECONDS if interval is None else interval
        self.enabled = show is not False
        mode = progress_mode()
        tty = mode == "bar" or (mode == "auto" and bool(getattr(self.stream, "isatty", lambda: False)()))
        self._label = progress_label()
        self._bar: Any = None
        self._steps_done = 0  # the tenths of the work already reported by a line
        self._start = time.monotonic()
        self._last = self._start
        if self.enabled and tty:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.total, unit=unit, desc=desc, file=self.stream, leave=True, dynamic_ncols=True)

    def set_phase(self, desc: str) -> None:
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description(desc, refresh=False)

    def update(self, n: int = 1) -> None:
        self.n += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        steps = min(STEPS * self.n // self.total, STEPS) if self.total else STEPS
        if steps > self._steps_done or now - self._last >= self.interval:
            self._steps_done = max(steps, self._steps_done)
            self._line(now)

    def _line(self, now: float) -> None:
        from tqdm import tqdm

        self._last = now
        text = tqdm.format_meter(min(self.n, self.total), self.total, now - self._start, prefix=self.desc,
                                 unit=self.unit, ncols=0)  # fmt: skip
        print(f"{self._label}: {text.strip()}" if self._label else text.strip(), file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def library_bars(show: bool | None) -> Iterator[None]:
    """With ``show`` False, transformers' own progress bars (the "Loading weights" of ``from_pretrained``) and the
    Hugging Face Hub's are off inside the block, and back as they were after it: ``progress=False`` means no
    progress output at all, and a caller's own settings outlive the call. Otherwise nothing changes."""
    if show is not False:
        yield
        return
    import importlib

    from transformers.utils import logging as hf_logging

    hub_bars = importlib.import_module("huggingface_hub.utils.tqdm")  # the module (its package exports a class)
    was_on = hf_logging.is_progress_bar_enabled()
    states = getattr(hub_bars, "progress_bar_states", None)  # the Hub's switches, global and per group
    saved = dict(states) if isinstance(states, dict) else None
    with warnings.catch_warnings():  # an HF_HUB_DISABLE_PROGRESS_BARS=0 in the environment warns; it wins anyway
        warnings.simplefilter("ignore")
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if was_on:
                hf_logging.enable_progress_bar()
        if saved is not None and isinstance(states, dict):
            states.clear()
            states.update(saved)
