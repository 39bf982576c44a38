"""Distance profiles: per head, the mean and standard deviation of a matrix over samples and cells with i - j = d.

What a summary file stores as ``bias_profile`` / ``weights_profile`` (docs/hdf5.md, 'Summary files'), computed here from
a full file's matrices, streamed one (sample, head) matrix at a time. Sums are of differences from the first sample's
per-distance mean, so a profile that is constant over a diagonal has a standard deviation of exactly 0. Population
standard deviations (ddof=0), as everywhere in biasviz.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from biasviz.diagnostics.measures import read_once, subtract_diagonal


@dataclass
class Profiles:
    """(head, distance) mean and std; entry k is the distance ``start + k`` (``start`` 0 for causal files)."""

    mean: np.ndarray
    std: np.ndarray
    start: int = 0
    samples: int = 0


class ProfileAccumulator:
    """Running per-distance sums over the cells a model uses (j <= i when ``causal``, else every cell)."""

    def __init__(self, seq_len: int, causal: bool = True) -> None:
        pos = np.arange(seq_len)
        d = np.subtract.outer(pos, pos)
        self.cells = d >= 0 if causal else np.ones((seq_len, seq_len), dtype=bool)
        self.start = 0 if causal else -(seq_len - 1)
        self.index = d[self.cells] - self.start  # which distance each used cell is, row-major
        self.length = seq_len - self.start
        self.per = np.bincount(self.index, minlength=self.length).astype(np.float64)
        self.reset()

    def reset(self) -> None:
        """Start over (the next head), keeping the cell layout."""
        self.ref: np.ndarray | None = None
        self.sum = np.zeros(self.length)
        self.sumsq = np.zeros(self.length)
        self.n = 0

    def add(self, matrix: np.ndarray, count: int = 1) -> None:
        """One sample's (query, key) matrix, counted ``count`` times (a bias stored once for every sample)."""
        x = np.asarray(matrix, dtype=np.float64)[self.cells]
        if not np.isfinite(x).all():
            raise ValueError("NaN or infinite values in cells the model uses")
        if self.ref is None:
            self.ref = np.bincount(self.index, weights=x, minlength=self.length) / self.per
        dev = x - self.ref[self.index]
        self.sum += count * np.bincount(self.index, weights=dev, minlength=self.length)
        self.sumsq += count * np.bincount(self.index, weights=dev * dev, minlength=self.length)
        self.n += count

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        if self.ref is None:
            raise ValueError("no samples given")
        count = self.per * self.n
        mean_dev = self.sum / count
        return self.ref + mean_dev, np.sqrt(np.maximum(self.sumsq / count - mean_dev * mean_dev, 0.0))


def dataset_profiles(dataset: object, causal: bool = True, normalize: str = "none") -> Profiles:
    """Profiles of every head of a (sample, head, query, key) dataset, one stored matrix read at a time.

    ``normalize='diagonal'`` subtracts each row's diagonal value from each matrix first.
    """
    stored, repeat = read_once(dataset)
    n_samples, n_heads, seq_len = stored.shape[0], stored.shape[1], stored.shape[-1]  # type: ignore[attr-defined]
    means, stds = [], []
    acc = ProfileAccumulator(seq_len, causal)
    for h in range(n_heads):
        acc.reset()
        for s in range(n_samples):
            m = np.asarray(stored[s, h], dtype=np.float32)  # type: ignore[index]
            acc.add(subtract_diagonal(m) if normalize == "diagonal" else m, repeat)
        mean, std = acc.result()
        means.append(mean)
        stds.append(std)
    return Profiles(np.stack(means), np.stack(stds), acc.start, n_samples * repeat)


__all__ = ["ProfileAccumulator", "Profiles", "dataset_profiles"]
