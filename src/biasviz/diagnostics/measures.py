"""Context-independence diagnostics (README, "Reading the figures and diagnostics"), in plain numpy.

Per head, over the cells C the model uses (docs/hdf5.md, 'Attended cells': C = {(i, j): j <= i} in a causal model, every
cell in a bidirectional one), with b_s the bias of sample s and b̄ its mean:

- context dependence = mean over C of std over samples of b_s(i, j), divided by std over C of b̄;
- Toeplitz residual = RMS over C of (b̄(i, j) - mean of b̄ over its diagonal i - j), divided by std over C of b̄;
- separability residual = RMS over C of b̄(i, j) - (s_i - s_j) for the least-squares s, divided likewise;
- distance profile = mean and std of b_s(i, j) over all samples and cells with i - j = d, for every d >= 0.

Every standard deviation is the population one (ddof=0). Samples are streamed: one (query, key)
matrix at a time is added to running sums, so memory does not grow with the number of samples.
Sums are taken of differences from a reference value (the first sample, or a diagonal's first cell),
which keeps them exact where the answer is exactly 0: identical samples give a context dependence
of exactly 0.0, a bias that depends on i - j alone a Toeplitz residual of exactly 0.0.

When b̄ is constant over C (std 0) both ratios are undefined; they are reported as 0.0 when their
numerator is 0 too (a constant bias is trivially context-independent and Toeplitz), otherwise as
None with a note. Context dependence needs at least 2 samples; with one it is None, with a note.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

NORMALIZATIONS = ("none", "diagonal")


@dataclass
class HeadDiagnostics:
    """The diagnostics of one head; ``profile_*`` are indexed by distance d = i - j (0 .. T-1)."""

    head: int
    samples: int
    context_dependence: float | None
    toeplitz_residual: float | None
    profile_mean: np.ndarray
    profile_std: np.ndarray
    notes: list[str] = field(default_factory=list)
    separability_residual: float | None = None

    def as_json(self) -> dict[str, object]:
        # "index" counts from 0, as every index in files and JSON; "head" (1 .. H) is kept for existing scripts
        return {"index": self.head - 1, "head": self.head, "context_dependence": self.context_dependence,
                "toeplitz_residual": self.toeplitz_residual,
                "separability_residual": self.separability_residual}  # fmt: skip


# -- public functions -------------------------------------------------------------------------------


def subtract_diagonal(matrix: np.ndarray) -> np.ndarray:
    """Subtract each row's diagonal value b(i, i) from the row (last two axes are query, key).

    Softmax ignores a constant added to a row, so biases that differ by a per-row constant are
    equivalent; after this they are identical (e.g. a key-position form of ALiBi becomes -m (i - j)).

    >>> subtract_diagonal(np.array([[1., np.nan], [5., 7.]])).tolist()
    [[0.0, nan], [-2.0, 0.0]]
    """
    m = np.asarray(matrix)
    return m - np.diagonal(m, axis1=-2, axis2=-1)[..., :, None]


def diagnose_head(samples: Iterable[np.ndarray], head: int = 1, normalize: str = "none",
                  repeat: int = 1, causal: bool = True) -> HeadDiagnostics:  # fmt: skip
    """Diagnostics of one head from its (query, key) bias matrices, one per sample (streamed).

    ``repeat``: each matrix stands for that many identical samples (a bias stored once for all samples,
    ``bias_shared``): it is read once, and its context dependence is exactly 0 as soon as it counts twice.
    ``causal``: over the cells j <= i (a causal model), else over every cell (a bidirectional one).
    """
    acc: _HeadAccumulator | None = None
    for matrix in samples:
        m = np.asarray(matrix)
        if acc is None:
            acc = _HeadAccumulator(m.shape[-1], causal)
        acc.add(_normalized(m, normalize), repeat)
    if acc is None:
        raise ValueError("no samples given")
    return acc.result(head)


def diagnose_array(bias: np.ndarray, normalize: str = "none", causal: bool = True) -> list[HeadDiagnostics]:
    """Diagnostics of every head of a (sample, head, query, key) array."""
    b = np.asarray(bias)
    if b.ndim != 4 or b.shape[-1] != b.shape[-2]:
        raise ValueError(f"expected a (sample, head, query, key) array, got shape {b.shape}")
    return [diagnose_head((b[s, h] for s in range(b.shape[0])), h + 1, normalize, causal=causal)
            for h in range(b.shape[1])]  # fmt: skip


def read_once(dataset: object) -> tuple[object, int]:
    """What to read of a (sample, head, query, key) dataset and how many samples each read stands for: a bias stored
    once for every sample (a view with an integer ``repeat`` and ``stored``, :mod:`biasviz.store.views`) once, counted
    ``repeat`` times; anything else (an h5py dataset, a numpy array, whose ``repeat`` is a method) as it is."""
    repeat = getattr(dataset, "repeat", 1)
    if isinstance(repeat, int) and not isinstance(repeat, bool) and repeat > 1:
        return getattr(dataset, "stored", dataset), repeat
    return dataset, 1


def diagnose_dataset(dataset: object, normalize: str = "none", causal: bool = True) -> Iterator[HeadDiagnostics]:
    """Diagnostics of each head of an HDF5 (sample, head, query, key) dataset, read one matrix at a time.

    Each read is one stored chunk (one sample, one head), so a 4096-position file never loads whole. A bias
    stored once for every sample (a view with ``repeat`` and ``stored``, :mod:`biasviz.store.views`) is read
    once per head and counted ``repeat`` times.
    """
    stored, repeat = read_once(dataset)
    n_samples, n_heads = stored.shape[:2]  # type: ignore[attr-defined]
    for h in range(n_heads):
        mats = (np.asarray(stored[s, h], dtype=np.float32) for s in range(n_samples))  # type: ignore[index]
        yield diagnose_head(mats, h + 1, normalize, repeat, causal)


def diagnose_sweep(bias_file: Any, layer: int, normalize: str = "none") -> list[tuple[int, list[HeadDiagnostics]]]:
    """Diagnostics of each head at each checkpoint of a sweep file (``extract --checkpoints``), by step."""
    steps = bias_file.checkpoints
    if steps is None:
        raise ValueError("not a sweep file")
    causal = bias_file.layer_causal(layer)  # the layer's own rule (a BiasFile's, as every caller passes)
    return [(step, list(diagnose_dataset(bias_file.at_checkpoint(c).dataset("bias", layer), normalize, causal)))
            for c, step in enumerate(steps)]  # fmt: skip


# -- running sums -----------------------------------------------------------------------------------


def _normalized(matrix: np.ndarray, normalize: str) -> np.ndarray:
    if normalize == "none":
        return matrix
    if normalize == "diagonal":
        return subtract_diagonal(matrix)
    raise ValueError(f"normalize must be one of {NORMALIZATIONS}, not {normalize!r}")


def separability_rms(causal_values: np.ndarray, cells: np.ndarray) -> float:
    """RMS over the used cells of b(i, j) - (s_i - s_j) for the least-squares s (``cells``: the (T, T) mask of
    the cells used, the lower triangle of a causal model or every cell of a bidirectional one;
    ``causal_values``: b on it, row-major).

    Cumulative-decay biases (ALiBi, CABLE, FoX) are exactly s_i - s_j. Over the pairs j < i (the diagonal's
    residual is b(i, i) whatever s) the normal equations are those of a complete graph's Laplacian, T s - 1 S =
    r with r_k = sum_{j<k} b(k, j) - sum_{i>k} b(i, k), so s = r / T is a least-squares solution. Over every
    pair i != j each pair of positions is met twice, once each way: 2 (T s - 1 S) = r with r_k the sum of row k
    less the sum of column k (diagonal left out), so s = r / (2T).

    >>> t = 5; cells = np.tril(np.ones((t, t), bool)); s = np.arange(t) ** 2.0
    >>> round(separability_rms((s[:, None] - s[None, :])[cells], cells), 12)
    0.0
    """
    t = cells.shape[0]
    b = np.zeros(cells.shape, dtype=np.float64)
    b[cells] = causal_values
    diag = np.diagonal(b).copy()
    r = (b.sum(axis=1) - diag) - (b.sum(axis=0) - diag)
    s = r / t if not cells[0, 1:].any() else r / (2 * t)
    i, j = np.nonzero(cells)
    return float(np.sqrt(np.mean((b[i, j] - (s[i] - s[j])) ** 2)))


def _ratio(numerator: float, denominator: float) -> float | None:
    if denominator > 0:
        return float(numerator / denominator)
    return 0.0 if numerator == 0 else None


class _HeadAccumulator:
    """Shifted running sums over the used cells of one head (the lower triangle of a causal model, every cell of a
    bidirectional one), stored flat in row-major order."""

    def __init__(self, seq_len: int, causal: bool = True) -> None:
        self.seq_len = seq_len
        self.causal = causal
        full = np.ones((seq_len, seq_len), dtype=bool)
        self.cells = np.tril(full) if causal else full
        pos = np.arange(seq_len, dtype=np.int64)
        signed = np.subtract.outer(pos, pos)[self.cells]  # d = i - j of each used cell, row-major
        # diagonals by signed distance, slot d + T - 1; a causal model uses d >= 0 only (slots T - 1 ..)
        self.slot = signed + seq_len - 1
        self.per_slot = np.bincount(self.slot, minlength=2 * seq_len - 1).astype(np.float64)
        first = np.zeros(2 * seq_len - 1, dtype=np.int64)
        order = np.arange(len(signed))[::-1]  # written last to first: each diagonal keeps its first cell
        first[self.slot[order]] = order
        self.slot_start = first  # each diagonal's first used cell (row-major), as an index into the used cells
        self.lower = signed >= 0  # the profile's cells: distances d = i - j >= 0
        self.dist = signed[self.lower]
        self.per_dist = np.bincount(self.dist, minlength=seq_len).astype(np.float64)
        self.diag_start = first[seq_len - 1 :]  # cell (d, 0) of each d >= 0
        self.n = 0
        self.first: np.ndarray | None = None  # first sample: the shift for the per-cell sums
        self.sum = np.zeros(self.slot.shape, dtype=np.float64)  # per used cell
        self.sumsq = np.zeros(self.slot.shape, dtype=np.float64)
        self.profile_ref: np.ndarray | None = None  # first sample's b(d, 0): the shift per distance
        self.profile_sum = np.zeros(seq_len, dtype=np.float64)
        self.profile_sumsq = np.zeros(seq_len, dtype=np.float64)

    def add(self, matrix: np.ndarray, count: int = 1) -> None:
        """Add one sample's matrix, counted ``count`` times (identical samples)."""
        if matrix.shape != (self.seq_len, self.seq_len):
            raise ValueError(f"matrix of shape {matrix.shape}; expected {(self.seq_len, self.seq_len)}")
        x = np.asarray(matrix, dtype=np.float64)[self.cells]
        if not np.isfinite(x).all():
            used = "causal cells (j <= i)" if self.causal else "cells (a bidirectional model uses every cell)"
            raise ValueError(f"the bias has NaN or infinite values in {used}")
        if self.first is None:
            self.first = x
            self.profile_ref = x[self.diag_start]
        dev = x - self.first
        self.sum += count * dev
        self.sumsq += count * (dev * dev)
        assert self.profile_ref is not None
        pdev = x[self.lower] - self.profile_ref[self.dist]
        self.profile_sum += count * np.bincount(self.dist, weights=pdev, minlength=self.seq_len)
        self.profile_sumsq += count * np.bincount(self.dist, weights=pdev * pdev, minlength=self.seq_len)
        self.n += count

    def result(self, head: int) -> HeadDiagnostics:
        assert self.first is not None and self.profile_ref is not None
        notes: list[str] = []
        mean_dev = self.sum / self.n
        mean = self.first + mean_dev  # b̄ over the used cells
        spread = float(np.std(mean - mean[0]))  # std over C of b̄ (shifted: exactly 0 for a constant)
        if self.n < 2:
            dependence = None
            notes.append(f"head {head}: context dependence needs at least 2 samples, the file holds 1")
        else:
            sample_std = np.sqrt(np.maximum(self.sumsq / self.n - mean_dev * mean_dev, 0.0))
            dependence = _ratio(float(sample_std.mean()), spread)
        shifted = mean - mean[self.slot_start][self.slot]  # b̄ minus its diagonal's first cell
        slots = len(self.per_slot)
        diag_mean = np.bincount(self.slot, weights=shifted, minlength=slots) / np.maximum(self.per_slot, 1.0)
        residual = _ratio(float(np.sqrt(np.mean((shifted - diag_mean[self.slot]) ** 2))), spread)
        used = "causal" if self.causal else "used"
        undefined = f"undefined (the mean bias is constant over the {used} cells, the sums are not)"
        if dependence is None and self.n >= 2:
            notes.append(f"head {head}: context dependence {undefined}")
        if residual is None:
            notes.append(f"head {head}: Toeplitz residual {undefined}")
        separability = _ratio(separability_rms(mean, self.cells), spread)
        if separability is None:
            notes.append(f"head {head}: separability residual {undefined}")
        count = self.per_dist * self.n
        p_mean_dev = self.profile_sum / count
        p_var = np.maximum(self.profile_sumsq / count - p_mean_dev * p_mean_dev, 0.0)
        return HeadDiagnostics(head=head, samples=self.n, context_dependence=dependence,
                               toeplitz_residual=residual, profile_mean=self.profile_ref + p_mean_dev,
                               profile_std=np.sqrt(p_var), notes=notes,
                               separability_residual=separability)  # fmt: skip


__all__ = ["NORMALIZATIONS", "HeadDiagnostics", "subtract_diagonal", "diagnose_head", "diagnose_array",
           "diagnose_dataset"]  # fmt: skip
