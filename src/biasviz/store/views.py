"""Datasets seen as a plain file's (sample, head, query, key) dataset: one checkpoint of a sweep, or a bias
stored once for every sample (``bias_shared``, docs/hdf5.md, 'Summary files').

Readers of format 1 index ``dataset[s, h]`` one sample at a time; these views keep that working, so
plots, diagnostics and the explorer need not know how a file stores its matrices.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np


class OneCheckpoint:
    """A sweep dataset (checkpoint, sample, head, query, key) seen at one checkpoint, as a plain file's is."""

    def __init__(self, ds: h5py.Dataset, index: int) -> None:
        self._ds, self._index = ds, index
        self.shape, self.ndim, self.dtype = ds.shape[1:], ds.ndim - 1, ds.dtype
        self.chunks = None if ds.chunks is None else ds.chunks[1:]

    def __getitem__(self, sel: Any) -> Any:
        return self._ds[(self._index, *(sel if isinstance(sel, tuple) else (sel,)))]

    def __len__(self) -> int:
        return self.shape[0]

    def __getattr__(self, name: str) -> Any:  # compression, shuffle, attrs, ...: the dataset's own
        return getattr(self._ds, name)


class SharedSamples:
    """A (1, head, query, key) bias stored once, seen as (samples, head, query, key): every sample reads it.

    ``repeat`` (the number of samples) and ``stored`` (the one-sample dataset) let readers that reduce
    over samples read the matrix once and count it ``repeat`` times (:mod:`biasviz.diagnostics.measures`).
    """

    shared = True

    def __init__(self, stored: h5py.Dataset | OneCheckpoint, n_samples: int) -> None:
        self.stored, self.repeat = stored, n_samples
        self.shape = (n_samples, *stored.shape[1:])
        self.ndim, self.dtype, self.chunks = len(self.shape), stored.dtype, stored.chunks

    def __len__(self) -> int:
        return self.repeat

    def __getitem__(self, sel: Any) -> np.ndarray:
        parts = sel if isinstance(sel, tuple) else (sel,)
        if parts == () or parts[0] is Ellipsis:
            parts = (slice(None), *parts[1:]) if parts else (slice(None),)
        first, rest = parts[0], parts[1:]
        if isinstance(first, (int, np.integer)):
            if not -self.repeat <= int(first) < self.repeat:
                raise IndexError(f"sample {int(first)} out of range for {self.repeat} samples")
            return np.asarray(self.stored[(0, *rest)])
        rows = np.arange(self.repeat)[first]  # which samples: a slice, a list or a mask of them
        one = np.asarray(self.stored[(0, *rest)])
        return np.array(np.broadcast_to(one, (len(rows), *one.shape)))

    def __getattr__(self, name: str) -> Any:  # compression, shuffle, attrs, ...: the stored dataset's own
        if name == "id":  # its chunks hold one sample: copying them as the chunks of every sample would be wrong
            raise AttributeError("a shared bias has no per-sample chunks")
        return getattr(self.stored, name)


__all__ = ["OneCheckpoint", "SharedSamples"]
