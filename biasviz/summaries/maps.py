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


def used_cells(row0: int, rows: int, keys: int, causal: bool, device: torch.device) -> torch.Tensor:
    """(rows, keys) bool: True where query ``row0 + r`` uses key ``j``.

    >>> used_cells(1, 2, 3, True, torch.device("cpu")).int().tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    if not causal:
        return torch.ones(rows, keys, dtype=torch.bool, device=device)
    i = torch.arange(row0, row0 + rows, device=device)[:, None]
    return torch.arange(keys, device=device)[None, :] <= i


def zero_above(v: torch.Tensor, row0: int) -> torch.Tensor:
    """A copy of the causal row block ``v`` (..., rows, row0 + rows) with 0 where key j > query i.

    Such cells lie in the block's trailing square only, so only that square is masked (a mask over the whole
    block costs twenty times a copy on the CPU).
    """
    rows, keys = v.shape[-2:]
    out = v.clone()
    square = out[..., keys - rows :]
    square.copy_(torch.where(used_cells(0, rows, rows, True, v.device), square, 0.0))
    return out


def _at(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[..., index]`` with 0 where ``index < 0`` (the empty prefix)."""
    got = table[..., index.clamp(min=0)]
    return torch.where(index >= 0, got, 0.0)


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

    def total(values: torch.Tensor) -> torch.Tensor:
        g = values.cumsum(-1).cumsum(-1)  # (H, T): G
        out = _at(g, a1 - 1 - b0) - _at(g, lo - 1 - b0) - _at(g, a1 - 1 - b1) + _at(g, lo - 1 - b1)
        return torch.where(a1 > b0, out, 0.0)  # no cell j <= i when the block lies above the diagonal

    return total(f64), total(ones)[0]


class BlockMaps:
    """Running block sums of per-cell values (the mean and the spread over samples); counts come from geometry."""

    def __init__(self, heads: int, seq_len: int, block: int, device: torch.device, names: tuple[str, ...],
                 causal: bool = True) -> None:  # fmt: skip
        self.block, self.seq_len, self.causal = block, seq_len, causal
        self.n_blocks = -(-seq_len // block)
        shape = (heads, self.n_blocks, self.n_blocks)
        self.sums = {name: torch.zeros(shape, dtype=torch.float64, device=device) for name in names}

    def _pool(self, x: torch.Tensor, row0: int, into: torch.Tensor) -> torch.Tensor:
        """Add (H, rows, K) cell values into ``into`` (H, nb, nb) by the block of each cell; returns the row sums
        per key block (H, rows, nk), whose finiteness tells whether every cell was finite."""
        rows, keys = x.shape[-2:]
        b = self.block
        whole = keys // b
        if b == 1:
            pooled = x
        else:  # whole key blocks as a view, the last partial one apart: no padded copy
            parts = [x[..., : whole * b].unflatten(-1, (whole, b)).sum(-1)]
            if keys > whole * b:
                parts.append(x[..., whole * b :].sum(-1, keepdim=True))
            pooled = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]  # (H, rows, nk)
        nk = pooled.shape[-1]
        q = torch.arange(row0, row0 + rows, device=x.device) // b  # query block of each row
        into[..., :nk].index_add_(1, q, pooled.to(into.dtype))
        return pooled

    def add(self, row0: int, values: dict[str, torch.Tensor], used: torch.Tensor | None) -> bool:
        """Add rows ``row0 ..`` of each named (H, rows, K) per-cell value; ``used`` (rows, K) marks the used cells
        (None: the values are already 0 wherever a cell is not used). Returns whether every value was finite.

        A name left out adds 0 (the spread over samples of a bias that is the same for all of them).
        """
        finite = True
        for name, v in values.items():
            pooled = self._pool(v if used is None else torch.where(used, v, 0.0), row0, self.sums[name])
            finite = finite and bool(torch.isfinite(pooled.sum(dtype=torch.float64)))
        return finite

    def counts(self) -> torch.Tensor:
        """(nb, nb) used cells per block: j <= i in a causal model, all of them otherwise."""
        device = next(iter(self.sums.values())).device
        if self.causal:
            ones = torch.ones(1, self.seq_len, dtype=torch.float64, device=device)
            return block_sums(ones, self.seq_len, self.block)[1]
        sizes = torch.full((self.n_blocks,), float(self.block), dtype=torch.float64, device=device)
        sizes[-1] = self.seq_len - self.block * (self.n_blocks - 1)
        return sizes[:, None] * sizes[None, :]

    def result(self, name: str) -> torch.Tensor:
        """(H, nb, nb) float32 block means, NaN where a block has no used cell."""
        count = self.counts()
        mean = self.sums[name] / count
        return torch.where(count > 0, mean, float("nan")).float()
