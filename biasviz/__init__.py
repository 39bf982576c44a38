"""biasviz: extract, store and plot the positional attention biases of GPT-2-style models."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("biasviz")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"


def __getattr__(name: str) -> object:
    """The Python API, imported on first use so that ``import biasviz`` (and the CLI) stays fast."""
    if name == "explore":
        from biasviz.explorer import explore

        return explore
    raise AttributeError(f"module 'biasviz' has no attribute {name!r}")


__all__ = ["__version__", "explore"]
