"""Sums along the diagonals i - j = d: the distance profile and the Toeplitz residual, in O(H·T) memory.

Each cell is shifted by its diagonal's first cell (d, 0) before it is summed, so a diagonal whose cells are
all equal (every context-free bias that depends on i - j alone) has a spread and a residual of exactly 0.
Only cells with j <= i are summed, as in :mod:`biasviz.diagnostics.measures`.
"""

from __future__ import annotations

import torch

from biasviz.summaries.attended import Attended
from biasviz.summaries.scratch import Scratch

DEV, DEV_SQ, SPREAD_SQ = 0, 1, 2


class DiagonalSums:
    """Per head and distance: sums of (mean - ref_d), of its square, and of the per-cell variance over samples.

    Slot ``T - 1 - d`` holds distance ``d``, so query row i's keys j = 0 .. i fill the contiguous slots
    ``T - 1 - i .. T - 1`` in order: one slice add per row, no scatter.
    """

    def __init__(self, heads: int, seq_len: int, device: torch.device) -> None:
        self.seq_len = seq_len
        self.ref = torch.zeros(heads, seq_len, dtype=torch.float64, device=device)  # (H, T) reversed
        self.sums = torch.zeros(3, heads, seq_len, dtype=torch.float64, device=device)  # (3, H, T) reversed
        self.count = torch.zeros(seq_len, dtype=torch.float64, device=device)  # (T,) reversed

    def add(self, row0: int, values: torch.Tensor, scratch: Scratch | None = None) -> None:
        """Rows ``row0 ..`` of the per-cell mean and, if ``values`` (S, H, rows, K) holds two, the standard
        deviation over samples (else 0); K >= row0 + rows: every row's keys reach its diagonal. Temporaries are
        made in ``scratch``, if given.

        Distances 0 .. row0, which every row reaches, are read as a skewed view of the block itself (row r's
        keys r .. r + row0, a row stride one longer): the shift is subtracted and the spread squared straight
        from it, and a sum over rows is a sum along the diagonals. The rows - 1 longer distances, reached by
        some rows only, go through a small skewed copy whose cells before a row's first key hold the shift
        (and 0 for the spread), so they are exactly 0 once the shift is subtracted. The mean's and the
        spread's squares go into the adjacent slots DEV_SQ and SPREAD_SQ.
        """
        t = self.seq_len
        s, heads, rows, keys = values.shape
        span = row0 + rows  # distances row0 + rows - 1 .. 0: slots t - span .. t - 1
        if keys < span:
            raise ValueError(f"rows {row0} .. {span - 1} need {span} keys, got {keys}")
        scratch = scratch or Scratch()
        # the first cell (d, 0) of each diagonal that starts in these rows is its shift
        self.ref[:, t - row0 - rows : t - row0] = values[0, :, :, 0].flip(-1).double()
        ref = self.ref[:, t - span :].to(values.dtype)  # (H, span): column c holds distance span - 1 - c
        lead = rows - 1  # columns 0 .. rows - 2: distances row0 + 1 .. row0 + rows - 1
        st = values.stride()
        every = values.as_strided((s, heads, rows, row0 + 1), (st[0], st[1], st[2] + st[3], st[3]),
                                  values.storage_offset())  # (S, H, rows, row0 + 1): row r's keys r .. r + row0
        out = scratch.take(every.shape[1:], s, values.dtype, values.device)
        dev = torch.sub(every[0], ref[:, None, lead:], out=out[0])
        slots = slice(t - row0 - 1, t)
        self.sums[DEV, :, slots] += dev.sum(1)  # a block's rows in float32, the running sums in float64
        self.sums[DEV_SQ, :, slots] += dev.square_().sum(1)
        if s > 1:
            self.sums[SPREAD_SQ, :, slots] += torch.mul(every[1], every[1], out=out[1]).sum(1)
        if lead:
            z = self._skewed(values[..., :lead], ref[:, :lead], lead, scratch)  # (S, H, rows, lead)
            z[0].sub_(ref[:, None, :lead])
            slots = slice(t - span, t - row0 - 1)
            self.sums[DEV, :, slots] += z[0].sum(1)
            self.sums[DEV_SQ : DEV_SQ + s, :, slots] += z.square_().sum(2)
        self.count[t - span :] += torch.arange(1, span + 1, device=values.device).clamp_(max=rows)

    @staticmethod
    def _skewed(x: torch.Tensor, ref: torch.Tensor, span: int, scratch: Scratch) -> torch.Tensor:
        """(S, H, rows, K) -> (S, H, rows, span) in ``scratch``, row r's key j at column j + rows - 1 - r (columns
        past ``span``, distances below 0, are dropped); the columns before a row's first key hold ``ref`` (H, span)
        in the first of the S, 0 in the others."""
        s, heads, rows, keys = x.shape
        width = max(span, keys + rows - 1)
        z = scratch.take((heads, rows, width), s, x.dtype, x.device)
        lead = z[..., : rows - 1]  # the only cells the copy leaves: row r's first rows - 1 - r
        lead[0] = ref[:, None, : rows - 1]
        lead[1:] = 0.0
        z.as_strided(x.shape, (heads * rows * width, rows * width, width - 1, 1), rows - 1).copy_(x)
        return z[..., :span]

    def profile(self) -> torch.Tensor:
        """(2, H, T) float32: mean and standard deviation over samples and cells, by distance d = 0 .. T-1."""
        n = self.count.flip(-1)  # (T,) distance order
        dev = self.sums[DEV].flip(-1) / n
        within = self.sums[SPREAD_SQ].flip(-1) / n  # mean over cells of the variance over samples
        between = torch.clamp(self.sums[DEV_SQ].flip(-1) / n - dev * dev, min=0.0)  # variance over cells
        mean = self.ref.flip(-1) + dev
        return torch.stack([mean, torch.sqrt(within + between)]).float()

    def toeplitz_rss(self) -> torch.Tensor:
        """(H,) sum over cells of (b̄ - its diagonal's mean)²: the Toeplitz residual's numerator, squared."""
        n = torch.clamp(self.count, min=1.0)
        per_d = self.sums[DEV_SQ] - self.sums[DEV] ** 2 / n
        return torch.clamp(per_d, min=0.0).sum(-1)


class UpperDiagonalSums:
    """Sums along the diagonals j - i = d > 0, the keys after their query that a bidirectional model uses: the
    Toeplitz residual's other half (the profile keeps d = i - j >= 0, :class:`DiagonalSums`).

    Each diagonal is shifted by its first cell (0, d), which the first row block holds, so a bias that depends on
    j - i alone leaves exactly 0. Cells are gathered by their distance (a bidirectional block is O(rows x T) anyway).
    """

    def __init__(self, heads: int, seq_len: int, device: torch.device) -> None:
        self.seq_len = seq_len
        self.ref = torch.zeros(heads, seq_len, dtype=torch.float64, device=device)  # (H, T): b̄(0, d)
        self.sums = torch.zeros(2, heads, seq_len, dtype=torch.float64, device=device)  # DEV, DEV_SQ by d
        self.count = torch.zeros(seq_len, dtype=torch.float64, device=device)

    def add(self, row0: int, values: torch.Tensor) -> None:
        """Rows ``row0 ..`` of the per-cell mean, ``values[0]`` (H, rows, T), every key present."""
        mean = values[0]
        rows, keys = mean.shape[-2:]
        if keys != self.seq_len:
            raise ValueError(f"a bidirectional block holds every key: {keys} of {self.seq_len}")
        if row0 == 0:
            self.ref = mean[:, 0, :].double()
        device = mean.device
        d = torch.arange(keys, device=device)[None, :] - torch.arange(row0, row0 + rows, device=device)[:, None]
        after = d > 0
        dist = d[after]  # (n,)
        dev = mean[:, after].double() - self.ref[:, dist]  # (H, n)
        self.sums[DEV].index_add_(1, dist, dev)
        self.sums[DEV_SQ].index_add_(1, dist, dev.square_())
        self.count.index_add_(0, dist, torch.ones_like(dist, dtype=torch.float64))

    def toeplitz_rss(self) -> torch.Tensor:
        """(H,) sum over the cells j > i of (b̄ - its diagonal's mean)²."""
        n = torch.clamp(self.count, min=1.0)
        return torch.clamp(self.sums[DEV_SQ] - self.sums[DEV] ** 2 / n, min=0.0).sum(-1)


class MaskedDiagonalSums:
    """:class:`DiagonalSums` over the cells a model's own mask attends to (docs/hdf5.md, 'Attended cells'), by signed
    distance.

    Masked cells arrive as 0 and are left out by the mask; each distance divides by its attended cells. The sums
    run over every i - j (slot T - 1 + i - j), so that a bidirectional call's Toeplitz residual takes the diagonals
    after the query too, while the profile, as stored, is the half d = i - j >= 0. Each diagonal is shifted by the
    largest attended value it holds in the first block that reaches it (any attended value keeps a diagonal whose
    cells are all equal at exactly 0). Cells are gathered by their distance: a call with such a mask is summarised
    at the cost of one pass over its cells.
    """

    def __init__(self, heads: int, seq_len: int, device: torch.device, attended: Attended) -> None:
        self.seq_len, self.attended = seq_len, attended
        slots = 2 * seq_len - 1
        self.ref = torch.zeros(heads, slots, dtype=torch.float64, device=device)  # (H, 2T - 1) by i - j
        self.have = torch.zeros(heads, slots, dtype=torch.bool, device=device)
        self.sums = torch.zeros(3, heads, slots, dtype=torch.float64, device=device)
        self.seen = False

    def add(self, row0: int, values: torch.Tensor, mask: torch.Tensor) -> None:
        """Rows ``row0 ..``: mean and (if ``values`` (S, H, rows, K) holds two) spread, 0 where ``mask`` (1 or H,
        rows, K) leaves a cell out."""
        s, heads, rows, keys = values.shape
        device = values.device
        d = torch.arange(row0, row0 + rows, device=device)[:, None] - torch.arange(keys, device=device)[None, :]
        index = (d + self.seq_len - 1).reshape(1, -1).expand(heads, -1)  # (H, cells): slot of i - j
        used = mask.expand(heads, rows, keys).reshape(heads, -1)
        mean = values[0].reshape(heads, -1).double()
        top = torch.full(self.ref.shape, float("-inf"), dtype=torch.float64, device=device)
        top.scatter_reduce_(1, index, mean.masked_fill(~used, float("-inf")), "amax")
        fresh = ~self.have & (top > float("-inf"))
        self.ref = torch.where(fresh, top, self.ref)
        self.have |= fresh
        dev = (mean - torch.gather(self.ref, 1, index)).masked_fill_(~used, 0.0)
        self.sums[DEV].scatter_add_(1, index, dev)
        self.sums[DEV_SQ].scatter_add_(1, index, dev.square_())
        if s > 1:
            spread = values[1].reshape(heads, -1).double().masked_fill(~used, 0.0)
            self.sums[SPREAD_SQ].scatter_add_(1, index, spread.square_())
        self.seen = True

    def profile(self) -> torch.Tensor:
        """(2, H, T) float32: mean and standard deviation by distance d = i - j >= 0 over the attended cells; NaN
        where none."""
        n = self.attended.per_distance
        half = slice(self.seq_len - 1, None)
        dev = self.sums[DEV][:, half] / n
        within = self.sums[SPREAD_SQ][:, half] / n
        between = torch.clamp(self.sums[DEV_SQ][:, half] / n - dev * dev, min=0.0)
        out = torch.stack([self.ref[:, half] + dev, torch.sqrt(within + between)])
        return torch.where(n > 0, out, float("nan")).float()

    def toeplitz_rss(self) -> torch.Tensor:
        """(H,) sum over the attended cells of (b̄ - its diagonal's mean)², every diagonal (both sides of a
        bidirectional call's)."""
        n = torch.clamp(self.attended.per_signed, min=1.0)
        return torch.clamp(self.sums[DEV_SQ] - self.sums[DEV] ** 2 / n, min=0.0).sum(-1)
