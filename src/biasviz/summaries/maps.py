"""Block-mean maps: the per-cell mean and spread over samples, averaged over each block's used cells.

The sum of f(i - j) over a block's cells j <= i (and so the number of such cells) is O(1) with second-order
prefix sums: with F(x) = Σ_{d<=x} f(d) and G(x) = Σ_{y<=x} F(y), query rows [a0, a1) and keys [b0, b1) give
G(a1-1-b0) - G(lo-1-b0) - G(a1-1-b1) + G(lo-1-b1), lo = max(a0, b0) (F, G = 0 below 0).

A map has ceil(T / B) x ceil(T / B) blocks of B x B positions (B = ceil(T / R)); a block's value is the mean
over its used cells (j <= i in a causal model, every cell otherwise), NaN where it has none. With B = 1 the
map is the matrix itself. Rows arrive in blocks as the model forms them; only (H, nb, nb) sums are kept.
"""

from __future__ import annotations

import torch

from biasviz.common.shapes import gpu_shaped


def zero_above_(v: torch.Tensor) -> torch.Tensor:
    """``v``, a causal row block (..., rows, row0 + rows), with 0 where key j > query i, in place.

    Such cells lie in the block's trailing square only, so only that square is touched (a mask over the whole
    block costs twenty times a copy on the CPU); set to 0, not multiplied by a mask, so -inf and NaN go too.

    >>> zero_above_(torch.tensor([[1.0, 2.0, float("-inf")], [4.0, 5.0, 6.0]])).tolist()
    [[1.0, 2.0, 0.0], [4.0, 5.0, 6.0]]
    """
    rows, keys = v.shape[-2:]
    v[..., keys - rows :].tril_()
    return v


STRIDED_RUNS = 4  # runs this short along the last axis are summed as strided views on the CPU (see _group_sums)


def _group_sums(x: torch.Tensor, dim: int, start: int, size: int) -> torch.Tensor:
    """Sums of ``x`` along ``dim`` (negative) over the runs of positions ``start + n`` with the same
    ``(start + n) // size``: a partial run at either end apart, the whole runs as one view (no copy, no index).

    A sum over a short innermost axis is slow on the CPU (12 heads, 18 rows of 4096 keys, two threads: runs of 2
    1.29 ms, of 4 0.55 ms); up to STRIDED_RUNS cells a run are added as strided views instead (0.18, 0.31 ms; slower
    from 8 on), in the order a sum takes them.

    >>> _group_sums(torch.arange(7.0), -1, 1, 3).tolist()
    [1.0, 9.0, 11.0]
    """
    n = x.shape[dim]
    head = min(n, -start % size)
    whole, tail = divmod(n - head, size)
    shape = list(x.shape)
    shape[dim] = (head > 0) + whole + (tail > 0)
    out = x.new_empty(shape)
    if head:
        torch.sum(x.narrow(dim, 0, head), dim, keepdim=True, out=out.narrow(dim, 0, 1))
    if whole:
        runs = x.narrow(dim, head, whole * size).unflatten(dim, (whole, size))
        target = out.narrow(dim, int(head > 0), whole)
        if 1 < size <= STRIDED_RUNS and dim in (-1, x.dim() - 1) and not gpu_shaped(x.device):
            torch.add(runs[..., 0], runs[..., 1], out=target)  # a run's cells added as strided views, in order
            for i in range(2, size):
                target.add_(runs[..., i])
        else:
            torch.sum(runs, dim, out=target)
    if tail:
        torch.sum(x.narrow(dim, n - tail, tail), dim, keepdim=True, out=out.narrow(dim, shape[dim] - 1, 1))
    return out


def block_sums(f: torch.Tensor, seq_len: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per (query block, key block): the sum of f(i - j) over its cells j <= i (H, nb, nb), and their count.

    >>> s, c = block_sums(torch.tensor([[1.0, 10.0, 100.0]]), 3, 2)
    >>> s.tolist(), c.tolist()
    ([[[12.0, 0.0], [110.0, 1.0]]], [[3.0, 0.0], [2.0, 1.0]])
    """
    f64 = f.double()
    ones = torch.ones(1, seq_len, dtype=torch.float64, device=f.device)
    starts = torch.arange(0, seq_len, block, device=f.device)
    a0, b0 = starts[:, None], starts[None, :]
    a1, b1 = (a0 + block).clamp(max=seq_len), (b0 + block).clamp(max=seq_len)
    lo = torch.maximum(a0, b0)
    # where G is read, shifted by the 0 in front of it below: every x < 0 (an empty prefix) reads that 0, no mask
    at = [(x + 1).clamp_(min=0) for x in (a1 - 1 - b0, lo - 1 - b0, a1 - 1 - b1, lo - 1 - b1)]

    def total(values: torch.Tensor) -> torch.Tensor:
        g = torch.nn.functional.pad(values.cumsum(-1).cumsum(-1), (1, 0))  # (H, T + 1): 0, then G
        # a block above the diagonal reads four empty prefixes: 0, no cell j <= i
        return g[..., at[0]] - g[..., at[1]] - g[..., at[2]] + g[..., at[3]]

    return total(f64), total(ones)[0]


def geometry_counts(seq_len: int, block: int, causal: bool, device: torch.device | None = None) -> torch.Tensor:
    """(nb, nb) float64 cells per block of a call with no mask of its own: j <= i where causal, every cell otherwise.

    >>> geometry_counts(3, 2, True).tolist(), geometry_counts(3, 2, False).tolist()
    ([[3.0, 0.0], [2.0, 1.0]], [[4.0, 2.0], [2.0, 1.0]])
    """
    if causal:
        return block_sums(torch.ones(1, seq_len, dtype=torch.float64, device=device), seq_len, block)[1]
    n_blocks = -(-seq_len // block)
    sizes = torch.full((n_blocks,), float(block), dtype=torch.float64, device=device)
    sizes[-1] = seq_len - block * (n_blocks - 1)
    return sizes[:, None] * sizes[None, :]


class BlockMaps:
    """Running block sums of per-cell values (the mean and the spread over samples); counts come from geometry."""

    def __init__(self, heads: int, seq_len: int, block: int, device: torch.device, names: tuple[str, ...],
                 causal: bool = True) -> None:  # fmt: skip
        self.block, self.seq_len, self.causal = block, seq_len, causal
        self.n_blocks = -(-seq_len // block)
        self.stacked = torch.zeros(len(names), heads, self.n_blocks, self.n_blocks, dtype=torch.float64, device=device)
        self.sums = dict(zip(names, self.stacked.unbind(0), strict=True))  # (H, nb, nb) each
        self._counts: torch.Tensor | None = None

    def _pool(self, x: torch.Tensor, row0: int) -> torch.Tensor:
        """(S, H, rows, K) cell values of rows ``row0 ..`` summed by block: (S, H, nq, nk) float64, for the query
        blocks from ``row0 // block`` on. Rows first: a sum over a middle axis is fast, and the sum over a short
        innermost axis (the keys of a block, slow on the CPU) then runs on one row per query block. Both sums in
        the values' own precision, over a few rows at a time; only the running sums are float64."""
        if self.block == 1:
            return x.double()
        return _group_sums(_group_sums(x, -2, row0, self.block), -1, 0, self.block).double()

    def add(self, row0: int, values: torch.Tensor) -> None:
        """Add rows ``row0 ..`` of per-cell values (S, H, rows, K), the first S names' in order, 0 wherever a cell is
        not used. A name left out adds 0 (the spread over samples of a bias that is the same for all of them).

        Nothing is read back here: a value that is not finite stays in the float64 sums (NaN or infinite, never
        cancelled), and :meth:`finite` reads them once, when the layer is done.
        """
        pooled = self._pool(values, row0)
        q0 = row0 // self.block
        self.stacked[: len(pooled), :, q0 : q0 + pooled.shape[-2], : pooled.shape[-1]] += pooled

    def finite(self) -> bool:
        """Whether every value added was finite (one read of the device)."""
        return bool(torch.isfinite(self.stacked).all())

    def set_counts(self, counts: torch.Tensor) -> None:
        """The used cells per block (1 or H, nb, nb) of a model's own mask, in place of the geometry's."""
        self._counts = counts.to(self.stacked.device)

    def counts(self) -> torch.Tensor:
        """(nb, nb) used cells per block: j <= i in a causal model, all of them otherwise; worked out once, for
        every name's result."""
        if self._counts is None:
            self._counts = geometry_counts(self.seq_len, self.block, self.causal, self.stacked.device)
        return self._counts

    def result(self, name: str) -> torch.Tensor:
        """(H, nb, nb) float32 block means, NaN where a block has no used cell."""
        count = self.counts()
        mean = self.sums[name] / count
        return torch.where(count > 0, mean, float("nan")).float()
