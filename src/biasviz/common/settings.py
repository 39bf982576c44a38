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
