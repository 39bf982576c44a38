"""biasviz: extract, store and plot the positional attention biases of GPT-2-style models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("biasviz")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
