"""HDF5 format 1: how captured biases and attention weights are stored.

:mod:`.format` holds the vocabulary (NumPy only), :mod:`.writer` and :mod:`.reader` the two directions.
"""

from __future__ import annotations

from typing import Any

from biasviz.store.format import (
    DIMS,
    FILL,
    FLOAT16_MAX,
    FORMAT_VERSION,
    KEY_POSITION,
    RELATIVE,
    REQUIRED_ATTRS,
    causal_cells,
    chunk_rows,
    layer_group,
    utc_now,
)

_LAZY = {"BiasFile": "reader", "open_bias_file": "reader", "BiasFileWriter": "writer"}


def __getattr__(name: str) -> Any:
    """The reader and the writer (and h5py with them) are imported when first used."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"biasviz.store.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DIMS", "FILL", "FLOAT16_MAX", "FORMAT_VERSION", "KEY_POSITION", "RELATIVE", "REQUIRED_ATTRS", "BiasFile",
    "BiasFileWriter", "causal_cells", "chunk_rows", "layer_group", "open_bias_file", "utc_now",
]  # fmt: skip
