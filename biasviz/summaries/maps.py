"""Block-mean maps: the per-cell mean and spread over samples, averaged over each block's used cells.

A map has ceil(T / B) x ceil(T / B) blocks of B x B positions (B = ceil(T / R)); a block's value is the mean
over its used cells (j <= i in a causal model, every cell otherwise), NaN where it has none. With B = 1 the
map is the matrix itself. Rows arrive in blocks as the model forms them; only (H, nb, nb) sums are kept.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def used_cells(row0: int, rows: int, keys: int, causal: bool, device: torch.device) -> torch.Tensor:
    """(rows, keys) bool: True where query ``row0 + r`` uses key ``j``.

    >>> used_cells(1, 2, 3, True, torch.device("cpu")).int().tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    if not causal:
        return torch.ones(rows, keys, dtype=torch.bool, device=device)
    i = torch.arange(row0, row0 + rows, device=device)[:, None]
    return torch.arange(keys, device=device)[None, :] <= i


class BlockMaps:
    """Running block sums of per-cell values (the mean and the spread over samples) and used-cell counts."""

    def __init__(self, heads: int, seq_len: int, block: int, device: torch.device, names: tuple[str, ...]) -> None:
        self.block = block
        self.n_blocks = -(-seq_len // block)
        shape = (heads, self.n_blocks, self.n_blocks)
        self.sums = {name: torch.zeros(shape, dtype=torch.float64, device=device) for name in names}
        self.count = torch.zeros(shape[1:], dtype=torch.float64, device=device)  # (nb, nb), the same for every head

    def _pool(self, x: torch.Tensor, row0: int, into: torch.Tensor) -> None:
        """Add (..., rows, K) cell values into ``into`` (..., nb, nb) by the block of each cell."""
        rows, keys = x.shape[-2:]
        b = self.block
        nk = -(-keys // b)
        if b > 1:
            x = F.pad(x, (0, nk * b - keys)).unflatten(-1, (nk, b)).sum(-1)  # (..., rows, nk)
        q = torch.arange(row0, row0 + rows, device=x.device) // b  # query block of each row
        into[..., :nk].index_add_(into.dim() - 2, q, x.to(into.dtype))

    def add(self, row0: int, values: dict[str, torch.Tensor], used: torch.Tensor) -> None:
        """Add rows ``row0 ..`` of each named (H, rows, K) per-cell value; ``used`` (rows, K) marks the used cells.

        A name left out adds 0 (the spread over samples of a bias that is the same for all of them).
        """
        for name, v in values.items():
            self._pool(torch.where(used, v, 0.0), row0, self.sums[name])
        self._pool(used.to(torch.float32), row0, self.count)

    def result(self, name: str) -> torch.Tensor:
        """(H, nb, nb) float32 block means, NaN where a block has no used cell."""
        with torch.no_grad():
            mean = self.sums[name] / self.count
        return torch.where(self.count > 0, mean, float("nan")).float()
