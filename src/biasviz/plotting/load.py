"""Read the matrices to draw from a format-1 file, one (sample, head) chunk at a time.

Each head is read (or averaged over samples), normalized at full resolution and then block-reduced,
so a 12 x 4096 x 4096 file is never held in memory whole. A summary file's maps are already block means
over samples (:func:`load_summary_heads`); they are drawn with each block at the positions it covers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from biasviz.common.errors import BiasvizError
from biasviz.diagnostics.measures import subtract_diagonal
from biasviz.plotting.reduce import (
    DEFAULT_MAX_CELLS,
    Reduction,
    block_reduce,
    plan_reduction,
    weighted_block_mean,
)
from biasviz.plotting.scales import ValueRange
from biasviz.store import BiasFile, causal_cells


@dataclass
class HeadMatrices:
    """What a grid draws: (head, query, key) matrices, already masked and reduced, and how they were made."""

    data: np.ndarray
    seq_len: int
    layer: int
    sample: str
    reduction: Reduction
    block: int = 1  # positions per stored cell before ``reduction`` (a summary's block size)
    samples: int | None = None  # samples a mean is taken over (None: one sample)
    ranges: list[ValueRange] | None = None  # each head's values before ``reduction``: what the scales span

    @property
    def cell(self) -> int:
        """Positions each drawn cell covers, along each axis."""
        return self.block * self.reduction.factor


def load_heads(bf: BiasFile, kind: str, *, layer: int = -1, sample: int | str = 0, normalize: str = "none",
               reduce: str = "mean", max_cells: int = DEFAULT_MAX_CELLS) -> HeadMatrices:  # fmt: skip
    """The matrices of ``kind`` ('bias' or 'weights') for one sample or the mean over samples."""
    resolved = bf.resolve_layer(layer)
    ds = bf.dataset(kind, resolved)
    n_heads, seq_len = ds.shape[1], ds.shape[-1]
    plan = plan_reduction(seq_len, max_cells, reduce)
    out = np.empty((n_heads, plan.reduced_size, plan.reduced_size), dtype=np.float32)
    ranges, with_top = [], ValueRange.needs_percentile(kind)
    for h, m in enumerate(iter_heads(bf, kind, layer=resolved, sample=sample, normalize=normalize)):
        ranges.append(ValueRange.of(m, with_top))  # every cell, before the blocks average the extremes away
        out[h] = block_reduce(m, plan.factor, plan.how)
    label = sample if sample in ("mean", "std") else str(_samples(sample, ds.shape[0], bf)[0])
    return HeadMatrices(data=out, seq_len=seq_len, layer=resolved, sample=str(label), reduction=plan,
                        samples=ds.shape[0] if sample in ("mean", "std") else None, ranges=ranges)  # fmt: skip


def load_summary_heads(bf: BiasFile, name: str, *, layer: int = -1, normalize: str = "none", reduce: str = "mean",
                       max_cells: int = DEFAULT_MAX_CELLS) -> HeadMatrices:  # fmt: skip
    """A summary file's map ``name`` (``bias_mean``, ``weights_std``, ...), reduced further beyond ``max_cells``
    blocks per axis (block means weighted by the cells each averages)."""
    resolved = bf.resolve_layer(layer)
    m = bf.summary_map(name, resolved)
    block = bf.block or 1
    if normalize == "diagonal":
        if block > 1 or not name.endswith("_mean"):
            raise BiasvizError(f"--normalize diagonal subtracts each row's diagonal value cell by cell; {bf.path} "
                               f"is a summary in blocks of {block} positions, whose {name} cannot be normalized "
                               "afterwards (re-extract with --resolution at least the length, or without --summary)")
        m = subtract_diagonal(m)
    plan = plan_reduction(m.shape[-1], max_cells, reduce)
    ranges = [ValueRange.of(head, ValueRange.needs_percentile(name)) for head in m]  # the finest the file holds
    if plan.factor > 1:
        counts = bf.summary.counts if bf.summary is not None else np.ones(m.shape[-2:])
        m = weighted_block_mean(m, counts, plan.factor) if plan.how == "mean" else block_reduce(m, plan.factor, "max")
    return HeadMatrices(data=m, seq_len=bf.seq_len, layer=resolved, sample="mean", reduction=plan, block=block,
                        samples=bf.n_samples, ranges=ranges)  # fmt: skip


def iter_heads(bf: BiasFile, kind: str, *, layer: int = -1, sample: int | str = 0,
               normalize: str = "none") -> Iterator[np.ndarray]:  # fmt: skip
    """Each head's full-resolution (query, key) matrix, masked cells NaN, one head in memory at a time.

    ``sample`` is an index, 'mean' or 'std' (the per-cell standard deviation over samples), the last two
    accumulated one chunk at a time; damaged values are refused.
    """
    resolved = bf.resolve_layer(layer)
    ds = bf.dataset(kind, resolved)
    n_samples, n_heads, seq_len = ds.shape[0], ds.shape[1], ds.shape[-1]
    samples = _samples(sample, n_samples, bf)
    causal = bf.layer_causal(resolved)  # the layer's own rule (an encoder-decoder's calls differ)
    used = causal_cells(seq_len) if causal else np.ones((seq_len, seq_len), bool)
    # weights hold 0 where a causal call masks; a bidirectional one (T5 encoder) has no such cells
    masked = ~used if kind == "weights" and causal else None
    for h in range(n_heads):
        m = _head_std(ds, h, samples, normalize) if sample == "std" else _head_matrix(ds, h, samples)
        if not np.isfinite(m[used]).all():  # a damaged or hand-made file: never draw holes as if masked
            raise BiasvizError(
                f"{bf.path}: the {kind} of head {h + 1} (layer {resolved}) holds NaN or infinite values in cells "
                "the model uses; the file is damaged or was not written by 'biasviz extract'; extract it again"
            )
        if normalize == "diagonal" and sample != "std":
            m = subtract_diagonal(m)
        if masked is not None:
            m[masked] = np.nan  # weights hold 0 there (the bias holds NaN already); blank them alike
        yield m


def _samples(sample: int | str, n_samples: int, bf: BiasFile) -> list[int]:
    if sample in ("mean", "std"):
        return list(range(n_samples))
    k = int(sample)
    if not 0 <= k < n_samples:
        raise BiasvizError(f"sample {k} out of range; {bf.path} holds {n_samples} samples (0..{n_samples - 1})")
    return [k]


def _head_matrix(ds: object, head: int, samples: list[int]) -> np.ndarray:
    """One head's matrix, or its mean over ``samples`` accumulated one chunk at a time (float64 sums)."""
    if len(samples) == 1 or getattr(ds, "shared", False):  # a shared bias: every sample's is the first's
        return np.asarray(ds[samples[0], head], dtype=np.float32)  # type: ignore[index]
    total = np.zeros(ds.shape[-2:], dtype=np.float64)  # type: ignore[attr-defined]
    for s in samples:
        total += ds[s, head]  # type: ignore[index]
    return (total / len(samples)).astype(np.float32)


def _head_std(ds: object, head: int, samples: list[int], normalize: str) -> np.ndarray:
    """One head's per-cell population standard deviation over ``samples`` (sums of differences from the first
    sample, so identical samples give exactly 0); a shared bias is the same in every sample: 0."""
    first = np.asarray(ds[samples[0], head], dtype=np.float64)  # type: ignore[index]
    first = subtract_diagonal(first) if normalize == "diagonal" else first
    if getattr(ds, "shared", False):
        return np.where(np.isnan(first), np.nan, 0.0).astype(np.float32)
    total, squares = np.zeros_like(first), np.zeros_like(first)
    for s in samples[1:]:
        m = np.asarray(ds[s, head], dtype=np.float64)  # type: ignore[index]
        dev = (subtract_diagonal(m) if normalize == "diagonal" else m) - first
        total += dev
        squares += dev * dev
    n = len(samples)
    return np.sqrt(np.maximum(squares / n - (total / n) ** 2, 0.0)).astype(np.float32)


__all__ = ["HeadMatrices", "iter_heads", "load_heads", "load_summary_heads"]
