"""Settings read from the environment, checked as options are: a value biasviz does not know is an error."""

from __future__ import annotations

import os

from biasviz.common.errors import BiasvizError

ATTENTION_ENV = "BIASVIZ_ATTENTION"
ATTENTION_MODES = ("auto", "flex", "table", "sdpa")


def attention_mode() -> str:
    """``BIASVIZ_ATTENTION`` (unset or empty: ``auto``); any other value is one clear error, never ignored.

    A typo silently taken as ``auto`` would make a comparison of paths compare a path with itself.
    """
    text = os.environ.get(ATTENTION_ENV, "")
    value = text.strip().lower() or "auto"
    if value not in ATTENTION_MODES:
        raise BiasvizError(f"{ATTENTION_ENV}={text!r} is not one of {', '.join(ATTENTION_MODES)} (unset means auto)")
    return value


STATISTICS_ENV = "BIASVIZ_STATISTICS"
STATISTICS_MODES = ("auto", "fused", "torch")


def statistics_mode() -> str:
    """``BIASVIZ_STATISTICS`` (unset or empty: ``auto``, the fused kernels on a GPU where they cover a layer, torch
    elsewhere; ``torch``: never the kernels; ``fused``: the kernels wherever Triton runs them, Triton's interpreter
    on a CPU included). Any other value is one clear error."""
    text = os.environ.get(STATISTICS_ENV, "")
    value = text.strip().lower() or "auto"
    if value not in STATISTICS_MODES:
        raise BiasvizError(f"{STATISTICS_ENV}={text!r} is not one of {', '.join(STATISTICS_MODES)} "
                           "(unset means auto)")  # fmt: skip
    return value


PROGRESS_ENV = "BIASVIZ_PROGRESS"
PROGRESS_MODES = ("auto", "bar", "lines")
PROGRESS_FOR_ENV = "BIASVIZ_PROGRESS_FOR"


def progress_mode() -> str:
    """``BIASVIZ_PROGRESS`` (unset or empty: ``auto``, a bar on a terminal and lines in a log; ``lines``: lines
    on a terminal too, as ``make figures`` sets when its steps run side by side and bars would share one line;
    ``bar``: a bar wherever tqdm can draw one). Any other value is one clear error."""
    text = os.environ.get(PROGRESS_ENV, "")
    value = text.strip().lower() or "auto"
    if value not in PROGRESS_MODES:
        raise BiasvizError(f"{PROGRESS_ENV}={text!r} is not one of {', '.join(PROGRESS_MODES)} (unset means auto)")
    return value


def progress_label() -> str:
    """``BIASVIZ_PROGRESS_FOR``: what a progress line is for (``make figures`` names the file each step makes), as
    printable text of at most 80 characters; empty where unset."""
    text = os.environ.get(PROGRESS_FOR_ENV, "")
    return "".join(c if c.isprintable() else "?" for c in text.strip())[:80]


BACKEND_ENV = "MPLBACKEND"


def check_plot_backend() -> None:
    """``MPLBACKEND``, where set, must name a backend matplotlib has: matplotlib refuses any other as it is
    imported, with a ValueError deep inside the first figure. Checked before a command that draws starts."""
    text = os.environ.get(BACKEND_ENV, "")
    if not text.strip():
        return
    try:
        import matplotlib  # noqa: F401 - the import is what checks it
    except ValueError as exc:
        raise BiasvizError(f"{BACKEND_ENV}={text!r} is not a matplotlib backend; unset it or set it to a valid one "
                           f"such as agg ({str(exc).split(';')[0]})") from None  # fmt: skip
