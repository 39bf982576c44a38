"""The cells a call attends to, where that is not the causal triangle (docs/hdf5.md, 'Attended cells'): one mask for
every sample.

A sliding window, a local layer or a flex block mask leaves cells j <= i out. Every summary quantity is then taken
over the attended cells only: a map's block averages its attended cells (NaN with none), a profile divides by the
attended cells at each distance, the key profile by the queries that see each key, the diagnostics run over the
attended cells. This class holds the mask and the counts those divisions need, worked out once per layer.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from biasviz.adapters.rows import plain_cells
from biasviz.summaries.maps import _group_sums

ROWS_PER_STEP = 256  # rows of the mask counted at a time (a float copy of a few rows, whatever T)
SIGNED_CELLS = 1 << 24  # cells of the mask laid out by i - j at a time (per_signed)


def _skewed(rows: torch.Tensor) -> torch.Tensor:
    """(H, R, T) rows r0 .. r0 + R - 1 of a mask -> (H, R, 2T - 1) whose column c holds row i's cell at i - j = c + r0
    - T + 1 (0 where there is none): the keys reversed, each row padded with T zeros, and the rows read again 2T - 1 a
    row, which shifts row i by i places (a view, no index).

    >>> _skewed(torch.tensor([[[1, 0], [1, 1]]])).tolist()  # rows 0, 1 of a causal 2 x 2: i - j = c - 1
    [[[0, 1, 0], [0, 1, 1]]]
    """
    heads, r, t = rows.shape
    padded = torch.nn.functional.pad(rows.flip(-1), (0, t))  # (H, R, 2T): row i, column T - 1 - j
    return padded.view(heads, r * 2 * t)[:, : r * (2 * t - 1)].view(heads, r, 2 * t - 1)


class Attended:
    """A (1 or H, T, T) boolean mask of the attended cells, the same for every sample, with its counts."""

    def __init__(self, mask: torch.Tensor) -> None:
        if mask.dim() == 4:  # (1, 1 or H, T, T): the batch of one that stands for every sample
            mask = mask[0]
        self.mask = mask.bool()
        self.seq_len = mask.shape[-1]
        self._blocks: dict[int, torch.Tensor] = {}  # block size -> attended cells per block

    def rows(self, r0: int, r1: int, keys: int) -> torch.Tensor:
        """(1 or H, rows, keys): the attended cells of query rows r0 .. r1 - 1 against keys 0 .. keys - 1."""
        return self.mask[:, r0:r1, :keys]

    @functools.cached_property
    def per_distance(self) -> torch.Tensor:
        """(1 or H, T) float64: attended cells at each distance d = i - j >= 0 (what a stored profile runs over)."""
        return self.per_signed[:, self.seq_len - 1 :]

    @functools.cached_property
    def per_signed(self) -> torch.Tensor:
        """(1 or H, 2T - 1) float64: attended cells at each i - j, slot T - 1 + (i - j) (a bidirectional call's
        cells after the query too)."""
        t, heads = self.seq_len, self.mask.shape[0]
        out = torch.zeros(heads, 2 * t - 1, dtype=torch.float64, device=self.mask.device)
        step = max(1, SIGNED_CELLS // (2 * t * heads))
        for r0 in range(0, t, step):  # a few launches a block of rows, not one a diagonal (2T - 1 of them)
            out[:, r0:] += _skewed(self.mask[:, r0 : r0 + step]).sum(1, dtype=torch.float64)[:, : 2 * t - 1 - r0]
        return out

    @functools.cached_property
    def per_key(self) -> torch.Tensor:
        """(1 or H, T) float64: the queries that see each key."""
        return self.mask.sum(1, dtype=torch.float64)

    def block_counts(self, block: int) -> torch.Tensor:
        """(1 or H, nb, nb) float64: attended cells per block of ``block`` x ``block`` positions; counted once per
        block size (every part of the layer, and the file's shares, divide by the same counts)."""
        if block in self._blocks:
            return self._blocks[block]
        out = block_sums(self.mask, block)
        self._blocks[block] = out
        return out

    def block_shares(self, block: int, heads: int) -> torch.Tensor:
        """(H, nb, nb) float32: the share of each block's cells attended to (what a file stores as ``attended``)."""
        from biasviz.store.summary_reader import causal_block_counts

        cells = torch.as_tensor(causal_block_counts(self.seq_len, block, causal=False), device=self.mask.device)
        return (self.block_counts(block) / cells).expand(heads, -1, -1).float()

    def early_counts(self, first_keys: int) -> torch.Tensor:
        """(1 or H, T) float64: attended cells (d + j, j) with j < ``first_keys``, by distance d."""
        t = self.seq_len
        d = torch.arange(t, device=self.mask.device)
        out = torch.zeros(self.mask.shape[0], t, dtype=torch.float64, device=self.mask.device)
        for j in range(min(first_keys, t)):
            i = d + j
            inside = i < t
            out[:, inside] += self.mask[:, i[inside], j].double()
        return out

    def laplacian(self) -> torch.Tensor:
        """(1 or H, T, T) float64: the Laplacian of the pairs i != j attended to (each way counted), whose least
        squares s_i - s_j gives the separability residual over these cells."""
        m = self.mask.double()
        m.diagonal(dim1=1, dim2=2).zero_()
        a = m + m.transpose(1, 2)
        lap = -a
        lap.diagonal(dim1=1, dim2=2).add_(a.sum(-1))
        return lap


def block_sums(cells: torch.Tensor, block: int, r0: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
    """(C, rows, T) cells (bool, or counts) of query rows ``r0 ..`` summed per block of ``block`` x ``block``
    positions into ``out`` (C, nb, nb) float64 (new where None: the rows are the whole matrix), a few rows at a time."""
    t = cells.shape[-1]
    nb = -(-t // block)
    if out is None:
        out = torch.zeros(cells.shape[0], nb, nb, dtype=torch.float64, device=cells.device)
    step = max(block, ROWS_PER_STEP // block * block)  # whole query blocks at a time
    for s0 in range(0, cells.shape[1], step):
        rows = cells[:, s0 : s0 + step].float()
        pooled = _group_sums(_group_sums(rows, -2, r0 + s0, block), -1, 0, block)
        at = (r0 + s0) // block
        out[:, at : at + pooled.shape[1]] += pooled.double()
    return out


def samples_per_cell(sums: torch.Tensor, union: torch.Tensor, block: int, heads: int) -> np.ndarray:
    """(H, nb, nb) float32: per block, the mean over its cells some sample attends of the number of samples that
    attend each (``sums``: block sums over samples of their attended cells; NaN where no sample attends a cell)."""
    cells = block_sums(union, block)
    count = sums.to(cells.device) / cells.clamp(min=1)
    return torch.where(cells > 0, count, float("nan")).expand(heads, -1, -1).float().cpu().numpy()


def cells_before(attended: Attended | None, seq_len: int, causal: bool) -> torch.Tensor:
    """(1 or H, T, T) bool: what the samples before a switch to each sample's own cells attended, the call's one mask
    (``attended``) or its rule (the causal triangle, or every cell)."""
    if attended is not None:
        return attended.mask
    return plain_cells(0, seq_len, seq_len, causal, torch.device("cpu"))[0]


def triangle_share(seq_len: int, block: int, heads: int) -> np.ndarray:
    """(H, nb, nb) float32: the share of each block's cells with j <= i (a causal call among bidirectional ones)."""
    from biasviz.store.summary_reader import causal_block_counts

    share = causal_block_counts(seq_len, block, True) / causal_block_counts(seq_len, block, False)
    return np.broadcast_to(share, (heads, *share.shape)).astype(np.float32)
