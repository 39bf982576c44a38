"""biasviz: extract, store and plot the positional attention biases of transformer models.

``biasviz.trace(model)`` and ``biasviz.extract(model_or_path, input_ids, out)`` are the Python API for any
PyTorch model; they import torch on first use, so ``import biasviz`` (and the CLI's ``--help``) stays light.
"""

from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("biasviz")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

_LAZY = {"trace": "biasviz.tracing", "extract": "biasviz.api", "explore": "biasviz.explorer"}


def __getattr__(name: str) -> Any:
    """The Python API, imported on first use so that ``import biasviz`` (and the CLI) stays fast."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'biasviz' has no attribute {name!r}")


__all__ = ["__version__", "explore", "extract", "trace"]
