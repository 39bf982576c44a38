"""docs/position-measures.md's measures of the weights, from each sample's rows as they are formed: how far a head looks
(``band_mass``), where in its context (``context_mass``, the U-shape of Liu et al. 2024 and Hsieh et al. 2024),
how dispersed its weights are (``weights_entropy``), which keys it sinks into (``sink_keys``), and the standard
errors of these and of the key profile and sink share over samples.

Each sample's rows (H, rows, K) give, per query, the weight summed over a range of keys as a difference of two
prefix sums along the keys: a distance bin is one range (two for a bidirectional call), a tenth of the keys a query
sees is one range between the keys of two ranks. So the measures cost one cumulative sum per block and sample and
a gather per range, and keep per sample only (H, bins), (H, 10), (H, query blocks) and (H, T) sums: nothing of
size T², whatever N. The ranges count only the cells the call attends to: weights are 0 on the others, and the
queries that have keys in a range are counted from the call's own mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from biasviz.adapters.rows import RowBlock
from biasviz.common.shapes import gpu_shaped
from biasviz.store.datasets import (
    BAND_MASS,
    CONTEXT_MASS,
    KEY_PROFILE,
    SEGMENTS,
    SINK_DTYPE,
    SINK_KEYS,
    SINK_KEYS_OF_MEAN,
    SINK_RANKS,
    SINK_SEEN_PART,
    SINK_SHARE,
    WEIGHTS_ENTROPY,
    distance_bins,
    profile_name,
    se_name,
)
from biasviz.summaries.maps import _group_sums
from biasviz.summaries.pending import Pending
from biasviz.summaries.reducers import KernelSums, Reducer
from biasviz.summaries.sample_profiles import COUNT_ROWS, SampleProfiles, sample_stats
from biasviz.summaries.scratch import Scratch


def _prefix(cums: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Σ over keys j < index from inclusive cumulative sums (..., rows, K); ``index`` (rows, n) or (..., rows, n)
    in 0 .. K (0: nothing)."""
    idx = index.expand(*cums.shape[:-1], index.shape[-1]) if index.dim() == 2 else index
    return cums.gather(-1, (idx - 1).clamp(min=0)) * (idx > 0)


KEY_CHUNK = 32  # keys summed together in float32 before the float64 prefix (see prefix_sums)


@dataclass
class PrefixIndex:
    """Where :func:`prefix_sums` reads, for indices (1 or H, rows, n) into K keys: worked out once per block of rows
    (the same for every sample)."""

    run: torch.Tensor  # (1 or H, rows, n): the run of ``chunk`` keys each index falls in
    cells: torch.Tensor  # (1 or H, rows, n * chunk): that run's keys, clamped to K - 1
    inside: torch.Tensor  # (1 or H, rows, n, chunk) float32: 1 on the run's keys before the index, else 0
    chunk: int

    @classmethod
    def of(cls, index: torch.Tensor, keys: int, chunk: int = KEY_CHUNK) -> PrefixIndex:
        run = torch.div(index, chunk, rounding_mode="floor")
        at = (run * chunk)[..., None] + torch.arange(chunk, device=index.device)
        inside = (at < index[..., None]).float()
        return cls(run=run, cells=at.clamp(max=keys - 1).flatten(-2), inside=inside, chunk=chunk)


def prefix_sums(values: torch.Tensor, where: PrefixIndex) -> torch.Tensor:
    """Σ over keys j < index of ``values`` (B, H, rows, K) for each index of ``where``: (B, H, rows, n) float64.

    A float64 cumulative sum of every cell (a fresh 8-byte page per cell) cost 8x the softmax that made the weights
    (GPT-2-small shape, 16 rows of 8208 keys, one thread: 10.4 ms against 1.2; this: 1.2 ms). Here each cell is read
    once, in runs of ``chunk`` keys summed in the values' float32 (a sum of 32 weights rounds as the weights
    themselves do: 1.5e-7 at most against the float64 sum, measured on softmax rows of 33 to 8208 keys); the runs
    accumulate in float64, and only the part of a run before each index is gathered: (rows, n, chunk) cells, not
    (rows, K), and summed as the runs are (a product with a 0/1 mask and a float32 sum: 0.12 ms against 0.30 with
    a select and a float64 sum, 12 heads, 72 rows of 2120 keys).

    >>> w = torch.arange(1.0, 8.0).view(1, 1, 1, 7)
    >>> prefix_sums(w, PrefixIndex.of(torch.tensor([[[0, 1, 3, 7]]]), 7, chunk=2)).tolist()
    [[[[0.0, 1.0, 6.0, 28.0]]]]
    """
    lead = values.shape[:-2]
    runs = _group_sums(values, -1, 0, where.chunk)  # (B, H, rows, ceil(K / chunk)), in the values' precision
    before = torch.nn.functional.pad(runs.cumsum(-1, dtype=torch.float64), (1, 0))  # Σ of the runs before run c
    run = where.run.expand(*lead, *where.run.shape[-2:])
    cells = values.gather(-1, where.cells.expand(*lead, *where.cells.shape[-2:])).view(*run.shape, where.chunk)
    partial = (cells * where.inside).sum(-1)
    return before.gather(-1, run.clamp(max=before.shape[-1] - 1)) + partial


ENTROPY_BYTES = 1 << 21  # the entropy's rows worked in parts of about this size where a block is twice as large


def row_entropy(weights: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """-Σ_j w log w per row of ``weights`` (B, H, rows, K), 0 for w = 0: (B, H, rows) in the weights' dtype.

    The clamp only keeps log finite at w = 0 (3x faster than ``torch.special.entr``; ``torch.xlogy`` measured 4x
    slower), worked in a buffer kept from block to block (fresh pages for three temporaries cost 4x the arithmetic).
    On the CPU a block past twice ENTROPY_BYTES (from about 8192 keys with 12 heads) goes in parts of rows of about
    that size, so that the clamp, the log and the product work in a core's cache: 16 rows of 16384 keys, 12 heads, two
    threads, caches flushed before each call: 2.2 ms whole, 1.45 in parts of 2 MiB (at 4096 keys parts were slower).

    >>> w = torch.tensor([[[[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]]])
    >>> row_entropy(w, Scratch()).tolist()  # log 2, 0
    [[[0.6931471824645996, -0.0]]]
    """
    b, h, rows, keys = weights.shape
    row_bytes = b * h * keys * weights.element_size()
    whole = rows * row_bytes <= 2 * ENTROPY_BYTES or gpu_shaped(weights.device)  # a GPU: few, large kernels
    step = rows if whole else max(1, ENTROPY_BYTES // row_bytes)
    work = scratch.take((h, min(step, rows), keys), b, weights.dtype, weights.device)
    out = torch.empty(b, h, rows, dtype=weights.dtype, device=weights.device)
    for c in range(0, rows, step):
        part = weights[:, :, c : c + step]
        buf = work[:, :, : part.shape[2]]
        torch.clamp_min(part, torch.finfo(weights.dtype).tiny, out=buf)
        torch.sum(buf.log_().mul_(part), -1, out=out[:, :, c : c + step])
    return out.neg_()


@dataclass
class _Plan:
    """What a block's cells decide for its rows, the same for every sample they are the cells of: worked out once per
    block (per sample where samples are masked differently)."""

    key: tuple[int, int, int]  # (r0, rows, keys)
    cells: torch.Tensor | None  # the block's attended cells it was worked from (held: the same object is the same plan)
    ranges: list[tuple[torch.Tensor, torch.Tensor]]  # per distance bin, key ranges [a, b) by row
    bounds: PrefixIndex  # (1 or B, 1 or H, rows, S + 1): the first key of each tenth, then K
    qualifies: torch.Tensor  # (1 or B, 1 or H, rows): the query sees 10 keys or more
    looks: torch.Tensor  # (1 or B, 1 or H, rows): the query sees a key
    q0: int
    q1: int
    qblock: torch.Tensor  # (rows,) each row's query block - q0
    counts: torch.Tensor  # (1 or B, 1 or H, WeightMeasures' count columns): what the block's rows add to them


class WeightMeasures(Reducer):
    """One layer's per-sample sums for band mass, context mass, entropy and the keys' received weight, and each
    sample's queries that count for them, from the cells every block brings (its own, the call's one mask, or the
    causal triangle or every cell where it brings none): no mask is set beforehand, and samples masked differently
    need no switch part-way."""

    rows = (BAND_MASS, CONTEXT_MASS, WEIGHTS_ENTROPY, SINK_KEYS, SINK_KEYS_OF_MEAN)
    PER_SAMPLE = ("context", "entropy", "columns")
    # per sample, in one sum (one addition a block and sample), the queries that have keys in each bin / see >= 10
    # keys / see any, by query block; and the queries that see each key
    COUNTS = ("band_queries", "context_queries", "block_queries", "key_counts")

    def __init__(self, **sizes: Any) -> None:
        super().__init__(**sizes)
        bins = torch.as_tensor(distance_bins(self.seq_len), device=self.device)
        self.lo, self.hi = bins[:, 0], bins[:, 1]
        nqb = -(-self.seq_len // self.block)
        for name, width in zip(self.PER_SAMPLE, (SEGMENTS, nqb, self.seq_len), strict=True):
            self.zeros(name, self.heads, width)  # Σ over queries (or, columns, Σ_i w_a(i, j)) per sample and head
        edges = [int(e) for e in np.cumsum([0, len(bins), 1, nqb, self.seq_len])]
        self.count_at = {name: slice(a, b) for name, a, b in zip(self.COUNTS, edges[:-1], edges[1:], strict=True)}
        self.zeros("counts", 1, int(edges[-1]))  # one head until a block's cells differ by head
        self._planned: _Plan | None = None
        self._scratch = Scratch()  # the entropy's temporary, one block of rows
        # each sample's weights by distance: the band masses (a bin's distances summed) and the profile's SE
        self.diagonals = SampleProfiles(samples=self.samples, heads=self.heads, seq_len=self.seq_len,
                                        causal=self.causal, device=self.device)  # fmt: skip

    def _held(self) -> list[Pending]:
        return [self.diagonals]

    def widen(self) -> None:
        """Bins after the query too, from here on; each sample's sums and counts so far stand (its cells were
        causal)."""
        super().widen()
        self.diagonals.widen()
        self._planned = None

    def _add_counts(self, at: slice, counts: torch.Tensor) -> None:
        """A block's counts (1 or B, 1 or H, count columns) to samples ``at``, by head from the first that has them."""
        self.sums["counts"] = self._widened(self.sums["counts"], counts.shape[1])
        self._put(self.sums["counts"], (at,), counts)

    def count(self, name: str) -> torch.Tensor:
        """(N, 1 or H, width): one of :attr:`COUNTS`, per sample."""
        return self.sums["counts"][..., self.count_at[name]]

    def _band_ranges(self, r0: int, r1: int, keys: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per (row, bin), the key ranges [a, b) at the bin's distances: before the query, and (bidirectional) after."""
        i = torch.arange(r0, r1, device=self.device)[:, None]
        before = ((i - self.hi).clamp(0, keys), (i - self.lo + 1).clamp(0, keys))
        if self.causal:
            return [before]
        lo_after = torch.where(self.lo == 0, 1, self.lo)  # distance 0 counted once, before
        after = ((i + lo_after).clamp(0, keys), (i + self.hi + 1).clamp(0, keys))
        return [before, after]

    @staticmethod
    def _range_sums(cums: torch.Tensor, ranges: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Σ over keys in each range [a, b), from the inclusive cumulative sums ``cums`` (..., rows, K)."""
        total = None
        for a, b in ranges:
            part = _prefix(cums, b) - _prefix(cums, a)
            total = part if total is None else total + part
        assert total is not None
        return total

    def _plan(self, block: RowBlock) -> _Plan:
        """What ``block``'s cells decide for its rows; the last plan again for a block of the same rows and cells."""
        r0, r1, keys, cells = block.r0, block.r1, block.keys, block.attended
        key = (r0, r1 - r0, keys)
        if self._planned is not None and self._planned.key == key and _same(self._planned.cells, cells):
            return self._planned
        i = torch.arange(r0, r1, device=self.device)
        s = torch.arange(SEGMENTS + 1, device=self.device)
        ranges = self._band_ranges(r0, r1, keys)
        if cells is None and self.causal:  # rank r is key r; query i sees i + 1; key j is seen by rows i >= j
            seen = (i + 1)[None, None]
            bounds = (-(-(s[None, :] * seen[0, 0, :, None]) // SEGMENTS))[None, None]  # (1, 1, rows, S + 1)
            present = (ranges[0][1] > ranges[0][0]).sum(0, dtype=torch.float64)[None, None]
            j = torch.arange(keys, device=self.device)
            seen_by = (r1 - torch.clamp(j, min=r0)).clamp(min=0).double()[None, None]
        else:
            mask = block.cells(self.causal).to(self.device)  # (1 or B, 1 or H, rows, K)
            seen = mask.sum(-1)
            mask_cums = mask.long().cumsum(-1)  # attended keys up to and including each key
            need = -(-(s * seen[..., None]) // SEGMENTS)  # the first rank of each segment
            bounds = torch.searchsorted(mask_cums, (need + 1).contiguous())  # the key of that rank
            present = (self._range_sums(mask_cums, ranges) > 0).sum(-2, dtype=torch.float64)
            seen_by = mask.sum(-2, dtype=torch.float64)
        q0, q1 = r0 // self.block, (r1 - 1) // self.block + 1
        qualifies, looks = (seen >= SEGMENTS).double(), (seen > 0).double()
        counts = torch.zeros(*looks.shape[:2], self.sums["counts"].shape[-1], dtype=torch.float64, device=self.device)
        at = self.count_at
        counts[..., at["band_queries"]] = present
        counts[..., at["context_queries"]] = qualifies.sum(-1, keepdim=True)
        blocks = counts[..., at["block_queries"]][..., q0:q1]
        blocks.index_add_(-1, i // self.block - q0, looks)
        counts[..., at["key_counts"]][..., :keys] = seen_by
        plan = _Plan(key=key, cells=cells, ranges=ranges, bounds=PrefixIndex.of(bounds, keys), qualifies=qualifies,
                     looks=looks, q0=q0, q1=q1, qblock=i // self.block - q0, counts=counts)  # fmt: skip
        self._planned = plan
        return plan

    def add(self, block: RowBlock) -> None:
        """A block's weights (S, H, rows, K), 0 where a query does not look, over the cells it brings."""
        weights, r0 = block.weights, block.r0
        b, _, rows, keys = weights.shape
        plan = self._plan(block)
        at = slice(block.first, block.first + b)
        sums = self.sums
        self.diagonals.add(block.first, r0, weights, block.attended)  # the band masses: each bin's distances summed
        starts = prefix_sums(weights, plan.bounds)  # Σ before each segment's first key
        segment = starts[..., 1:] - starts[..., :-1]
        self._put(sums["context"], (at,), (segment * plan.qualifies[..., None]).sum(-2))
        entropy = row_entropy(weights, self._scratch).double()  # (B, H, rows)
        by_block = torch.zeros(b, self.heads, plan.q1 - plan.q0, dtype=torch.float64, device=self.device)
        by_block.index_add_(-1, plan.qblock, entropy * plan.looks)
        self._put(sums["entropy"], (at, slice(None), slice(plan.q0, plan.q1)), by_block)
        self._put(sums["columns"], (at, slice(None), slice(0, keys)), weights.sum(-2).double())
        self._add_counts(at, plan.counts)

    def state(self) -> dict[str, torch.Tensor]:
        return {**super().state(), **{f"diagonals.{k}": v for k, v in self.diagonals.state().items()}}

    def join(self, states: list[dict[str, torch.Tensor]]) -> None:
        """Every process's :meth:`state` in rank order: their samples one after another."""
        heads = max(s["counts"].shape[1] for s in states)
        wide = [{k: v.expand(-1, heads, -1) if k == "counts" else v for k, v in s.items()} for s in states]
        super().join([{k: v for k, v in s.items() if not k.startswith("diagonals.")} for s in wide])
        self.diagonals.join([{k.removeprefix("diagonals."): v for k, v in s.items() if k.startswith("diagonals.")}
                             for s in states])  # fmt: skip

    def result(self) -> dict[str, np.ndarray]:
        """The stored arrays: each measure's (mean, std) over samples, its SE (N >= 3), the sink keys, and the SE
        of the key profile and of the sink share."""
        out: dict[str, np.ndarray] = {}
        sums = self.sums

        def per_query(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
            return torch.where(count > 0, total / count.clamp(min=1), float("nan"))

        by_distance = self.diagonals.distance_sums()  # (N, H, T)
        ends = torch.cat([torch.zeros_like(by_distance[..., :1]), by_distance.cumsum(-1)], -1)
        band = ends[..., self.hi + 1] - ends[..., self.lo]  # (N, H, bins): each bin's distances
        per_sample = {BAND_MASS: per_query(band, self.count("band_queries")),
                      CONTEXT_MASS: per_query(sums["context"], self.count("context_queries")),
                      WEIGHTS_ENTROPY: per_query(sums["entropy"], self.count("block_queries"))}  # fmt: skip
        seen = self.count("key_counts")  # (N, 1 or H, T) the queries that see each key
        received = per_query(sums["columns"], seen)  # (N, H, T) mean received
        sink = received[..., 0]  # (N, H)
        for name, x in per_sample.items():
            stats, se = sample_stats(x)
            out[name] = stats.float().cpu().numpy()
            if se is not None:
                out[se_name(name)] = se.float().cpu().numpy()
        for name, x in ((se_name(KEY_PROFILE), received), (se_name(SINK_SHARE), sink)):
            _, se = sample_stats(x)
            if se is not None:
                out[name] = se.float().cpu().numpy()
        se = self.diagonals.standard_error()
        if se is not None:
            out[se_name(profile_name("weights"))] = se.float().cpu().numpy()
        least = sink_min_queries(seen)
        ranked = seen >= least  # (N, 1 or H, T): the keys each sample's ranking admits
        out[SINK_KEYS] = top_keys(received, ranked)
        out[SINK_KEYS_OF_MEAN] = top_keys(received.mean(0, keepdim=True), ranked.all(0, keepdim=True))[0]
        values = np.unique(least.cpu().numpy())
        out["sink_min_queries"] = (int(values[0]) if len(values) == 1 else
                                   np.broadcast_to(least[..., 0].cpu().numpy(), received.shape[:2]).astype(np.int64))
        return out

    def count_cells(self, first: int, samples: int, cells: torch.Tensor | None) -> None:
        """The queries that count for samples ``first .. first + samples - 1`` of a causal call, and its cells by
        distance, from the call's cells alone (1 or S, 1 or H, T, T; None: the causal triangle), a few rows at a time:
        where the weights were summed elsewhere (the fused kernels), counted by the plan that counts a block's."""
        at = slice(first, first + samples)
        for r0 in range(0, self.seq_len, COUNT_ROWS):
            r1 = min(self.seq_len, r0 + COUNT_ROWS)
            shaped = torch.empty((), device=self.device).expand(samples, 1, r1 - r0, r1)  # its shape alone
            part = None if cells is None else cells[..., r0:r1, :r1].to(self.device)
            plan = self._plan(RowBlock(0, first, r0, shaped, attended=part))
            self._add_counts(at, plan.counts)
        self.diagonals.count_cells(first, samples, cells)

    @classmethod
    def from_kernels(cls, sums: KernelSums) -> dict[str, np.ndarray] | None:
        """The fused kernels' per-sample sums of the measures (:attr:`KernelSums.measures`), the queries and cells that
        count for them counted from the call's cells (:meth:`count_cells`), finished as the torch path's own."""
        if sums.measures is None:
            return None
        n, heads, seq_len = sums.by_distance.shape
        got = cls(samples=n, heads=heads, seq_len=seq_len, block=sums.block, causal=True,
                  device=sums.by_distance.device)  # fmt: skip
        for name in cls.PER_SAMPLE:
            got.sums[name] = sums.measures[name].to(got.sums[name]).expand(n, -1, -1).clone()
        if sums.own_cells is not None:  # each sample's own: one (T, T) mask at a time
            for a in range(n):
                got.count_cells(a, 1, sums.own_cells[a][None, None])
        else:
            got.count_cells(0, n, sums.cells)
        got.diagonals.add_distance_sums(sums.by_distance)
        return got.result()


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two blocks' cells are the same cells: both none, or views of the same memory alike (the call's one
    mask, each block's rows of it); the plan holds the first, so its memory is not another's."""
    if a is None or b is None:
        return a is b
    return (a.data_ptr(), a.shape, a.stride(), a.device) == (b.data_ptr(), b.shape, b.stride(), b.device)


def sink_min_queries(seen: torch.Tensor) -> torch.Tensor:
    """The queries a key must be seen by to rank as a sink key: ceil(m / 8), m the most queries any key of the
    sample (and head) is seen by; ``seen`` (..., T) -> (..., 1) int64. In a causal call the last keys are seen by a
    few queries that attend locally: they would rank first by construction (docs/position-measures.md, 'Sink keys').

    >>> sink_min_queries(torch.arange(64.0, 0.0, -1.0)[None]).tolist()  # causal, T = 64
    [[8]]
    """
    most = seen.amax(-1, keepdim=True).long()
    return -(-most // SINK_SEEN_PART)


def top_keys(received: torch.Tensor, ranked: torch.Tensor | None = None) -> np.ndarray:
    """(N, H, T) mean received weight -> (N, H, 8) records (index, share), highest first, among the keys where
    ``ranked`` (broadcast to (N, H, T); None: every key) holds; keys no query sees are left out; fewer than 8 keys:
    index -1, share NaN."""
    n, h, t = received.shape
    ranked = received.nan_to_num(-1.0) if ranked is None else torch.where(ranked, received.nan_to_num(-1.0), -1.0)
    k = min(SINK_RANKS, t)
    share, index = ranked.topk(k, dim=-1)
    out = np.zeros((n, h, SINK_RANKS), dtype=SINK_DTYPE)
    out["index"] = -1
    out["share"] = np.nan
    keep = (share >= 0).cpu().numpy()
    out["index"][..., :k] = np.where(keep, index.cpu().numpy(), -1)
    out["share"][..., :k] = np.where(keep, share.float().cpu().numpy(), np.nan)
    return out
