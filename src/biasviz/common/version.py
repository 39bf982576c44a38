"""The installed version of biasviz, recorded in every file and figure it writes."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("biasviz")
except PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
