"""Block reduction of long (query, key) matrices before drawing.

A panel printed 1-2 inches wide holds a few hundred pixels, so a 4096 x 4096 matrix is reduced to
blocks first: the figure draws quickly, the PDF stays small, and every cell still contributes (a
plain resampler would skip rows). NaN cells (the causal mask) are ignored inside a block, and a
block that holds only NaN stays NaN, so the masked triangle stays blank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REDUCTIONS = ("mean", "max")
DEFAULT_MAX_CELLS = 600


@dataclass(frozen=True)
class Reduction:
    """How a matrix of ``size`` positions was reduced: ``factor`` x ``factor`` blocks by ``how``."""

    size: int
    factor: int
    how: str

    @property
    def reduced_size(self) -> int:
        return math.ceil(self.size / self.factor)

    def describe(self) -> str:
        """One line for figure metadata, e.g. ``block mean 7x7 (4096 -> 586 cells per axis)``."""
        if self.factor == 1:
            return f"none (full resolution, {self.size} cells per axis)"
        return f"block {self.how} {self.factor}x{self.factor} ({self.size} -> {self.reduced_size} cells per axis)"


def plan_reduction(size: int, max_cells: int = DEFAULT_MAX_CELLS, how: str = "mean") -> Reduction:
    """The smallest block factor that brings ``size`` down to at most ``max_cells`` per axis.

    >>> plan_reduction(512).factor, plan_reduction(4096).describe()
    (1, 'block mean 7x7 (4096 -> 586 cells per axis)')
    """
    if how not in REDUCTIONS:
        raise ValueError(f"unknown reduction '{how}'; use one of {REDUCTIONS}")
    if max_cells < 1:
        raise ValueError("max_cells must be positive")
    return Reduction(size=size, factor=max(1, math.ceil(size / max_cells)), how=how)


def block_reduce(matrix: np.ndarray, factor: int, how: str = "mean") -> np.ndarray:
    """NaN-aware block mean or max over the last two axes; the last block of an axis may be shorter.

    >>> block_reduce(np.array([[1., np.nan], [3., 5.]]), 2).tolist()
    [[3.0]]
    """
    a = np.asarray(matrix, dtype=np.float32)
    if factor == 1:
        return a
    if how not in REDUCTIONS:
        raise ValueError(f"unknown reduction '{how}'; use one of {REDUCTIONS}")
    valid = ~np.isnan(a)
    if how == "mean":
        total = _blocks(np.add, np.where(valid, a, np.float32(0)), factor)  # float32 sums: enough for drawing
        count = _blocks(np.add, valid.astype(np.float32), factor)
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (total / count).astype(np.float32)
    else:
        count = _blocks(np.add, valid.astype(np.float32), factor)
        out = _blocks(np.maximum, np.where(valid, a, np.float32(-np.inf)), factor)
    out[count == 0] = np.nan
    return out


def weighted_block_mean(matrix: np.ndarray, weights: np.ndarray, factor: int) -> np.ndarray:
    """Block means of ``matrix`` (last two axes) weighted by ``weights`` (e.g. the cells each entry averages).

    Reducing a summary's block means further must weigh each block by its cells, or a block on the diagonal
    (half its cells masked) would count as much as a full one. NaN entries and zero weights are left out.

    >>> weighted_block_mean(np.array([[1., np.nan], [4., 2.]]), np.array([[1, 0], [3, 1]]), 2).tolist()
    [[3.0]]
    """
    a = np.asarray(matrix, dtype=np.float64)
    w = np.broadcast_to(np.asarray(weights, dtype=np.float64), a.shape)
    valid = ~np.isnan(a) & (w > 0)
    total = _blocks(np.add, np.where(valid, a * w, 0.0), factor)
    count = _blocks(np.add, np.where(valid, w, 0.0), factor)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (total / count).astype(np.float32)
    out[count == 0] = np.nan
    return out


def _blocks(ufunc: np.ufunc, a: np.ndarray, factor: int) -> np.ndarray:
    """Apply ``ufunc`` over factor-sized runs of the last two axes (reshapes are views: no padded copy)."""
    return _runs(ufunc, _runs(ufunc, a, factor, -2), factor, -1)


def _runs(ufunc: np.ufunc, a: np.ndarray, factor: int, axis: int) -> np.ndarray:
    n = a.shape[axis]
    full = n - n % factor
    a = np.moveaxis(a, axis, -1) if axis != -1 else a
    head = ufunc.reduce(a[..., :full].reshape(*a.shape[:-1], full // factor, factor), axis=-1)
    if full < n:
        head = np.concatenate([head, ufunc.reduce(a[..., full:], axis=-1, keepdims=True)], axis=-1)
    return np.moveaxis(head, -1, axis) if axis != -1 else head


__all__ = ["REDUCTIONS", "DEFAULT_MAX_CELLS", "Reduction", "plan_reduction", "block_reduce", "weighted_block_mean"]
