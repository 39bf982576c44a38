"""The old home of ``biasviz.open`` and ``biasviz.plot`` (now :mod:`biasviz.notebook`): code that imports them from
here, and figures pickled while ``StyledFigure`` lived here (a pickle names its class's module), still find them."""

from __future__ import annotations

from typing import Any

from biasviz.notebook import INLINE_DPI, View, open, plot  # noqa: A004 - biasviz.open, as before


def __getattr__(name: str) -> Any:
    """``StyledFigure``: the one class of :mod:`biasviz.notebook`, made there on first use."""
    if name != "StyledFigure":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import biasviz.notebook

    return biasviz.notebook.StyledFigure


__all__ = ["INLINE_DPI", "View", "open", "plot"]
