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

import numpy as np
import torch

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
from biasviz.summaries.attended import Attended
from biasviz.summaries.maps import _group_sums
from biasviz.summaries.pending import Pending
from biasviz.summaries.sample_profiles import SampleProfiles, sample_stats
from biasviz.summaries.scratch import Scratch


@dataclass
class MeasureSummary:
    """What a file keeps of docs/position-measures.md's weight measures for one layer: name -> array (see
    store.datasets)."""

    arrays: dict[str, np.ndarray]


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
    """A block's mask, worked into what every sample's sums need."""

    key: tuple[int, int, int]  # (r0, rows, keys)
    ranges: list[tuple[torch.Tensor, torch.Tensor]]  # per distance bin, key ranges [a, b) by row
    bounds: PrefixIndex  # (1 or B, 1 or H, rows, S + 1): the first key of each tenth, then K
    qualifies: torch.Tensor  # (1 or B, 1 or H, rows): the query sees 10 keys or more
    looks: torch.Tensor  # (1 or B, 1 or H, rows): the query sees a key
    q0: int
    q1: int
    qblock: torch.Tensor  # (rows,) each row's query block - q0
    mask_cums: torch.Tensor | None  # (1 or B, 1 or H, rows, K) attended keys up to each key; None: causal


class WeightMeasures(Pending):
    """One layer's per-sample sums for band mass, context mass, entropy and the keys' received weight."""

    def __init__(self, *, samples: int, heads: int, seq_len: int, block: int, causal: bool,
                 device: torch.device, attended: Attended | None = None) -> None:  # fmt: skip
        self.n, self.heads, self.seq_len, self.block, self.causal = samples, heads, seq_len, block, causal
        self.attended, self.device = attended, device
        bins = torch.as_tensor(distance_bins(seq_len), device=device)
        self.lo, self.hi = bins[:, 0], bins[:, 1]
        nqb = -(-seq_len // block)
        f64 = {"dtype": torch.float64, "device": device}
        self.context = torch.zeros(samples, heads, SEGMENTS, **f64)
        self.entropy = torch.zeros(samples, heads, nqb, **f64)
        self.columns = torch.zeros(samples, heads, seq_len, **f64)  # Σ_i w_a(i, j)
        heads_of_mask = 1 if attended is None else attended.mask.shape[0]
        # queries (same for every sample, from the mask: a leading axis of one; per sample where samples are masked
        # differently) that have keys in each bin / see >= 10 keys / see any
        self.band_queries = torch.zeros(1, heads_of_mask, len(bins), **f64)
        self.context_queries = torch.zeros(1, heads_of_mask, 1, **f64)
        self.block_queries = torch.zeros(1, heads_of_mask, nqb, **f64)
        self._planned: _Plan | None = None
        self._scratch = Scratch()  # the entropy's temporary, one block of rows
        # each sample's weights by distance: the band masses (a bin's distances summed) and the profile's SE
        self.diagonals = SampleProfiles(samples=samples, heads=heads, seq_len=seq_len, causal=causal, device=device,
                                        attended=attended)  # fmt: skip

    def _held(self) -> list[Pending]:
        return [self.diagonals]

    batch_attended: torch.Tensor | None = None  # masks that differ by sample: the batch's (B or 1, 1 or H, T, T)
    by_samples = False
    _first = 0  # the batch under way's first sample (the plan is the batch's own)

    def by_sample(self, first: int) -> None:
        """From sample ``first`` on, each sample's own cells (:attr:`batch_attended`) count for it: the queries of
        each range counted per sample (those before by the one mask they had), the keys' too."""
        with torch.inference_mode(False):
            for name in self.COUNTS:
                before = getattr(self, name)
                own = torch.zeros(self.n, self.heads, before.shape[-1], dtype=torch.float64, device=self.device)
                own[:first] = before
                setattr(self, name, own)
            self.key_counts = torch.zeros(self.n, self.heads, self.seq_len, dtype=torch.float64, device=self.device)
            self.key_counts[:first] = self.per_key()
        self.diagonals.by_sample(first)
        self.by_samples, self.attended, self._planned = True, None, None

    def _mask(self, r0: int, r1: int, keys: int) -> torch.Tensor:
        """(1 or B, 1 or H, rows, keys) bool: the cells the call attends to."""
        if self.by_samples:
            assert self.batch_attended is not None
            return self.batch_attended[..., r0:r1, :keys].to(self.device)
        if self.attended is not None:
            return self.attended.rows(r0, r1, keys).to(self.device)[None]
        if not self.causal:
            return torch.ones(1, 1, r1 - r0, keys, dtype=torch.bool, device=self.device)
        i = torch.arange(r0, r1, device=self.device)[:, None]
        return (torch.arange(keys, device=self.device)[None, :] <= i)[None, None]

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

    def _plan(self, r0: int, rows: int, keys: int) -> _Plan:
        """What the mask decides for a block of rows, the same for every sample: worked out once per block (per
        batch and block where samples are masked differently)."""
        key = (self._first if self.by_samples else 0, r0, rows, keys)
        if self._planned is not None and self._planned.key == key:
            return self._planned
        r1 = r0 + rows
        i = torch.arange(r0, r1, device=self.device)
        s = torch.arange(SEGMENTS + 1, device=self.device)
        ranges = self._band_ranges(r0, r1, keys)
        if self.attended is None and self.causal and not self.by_samples:  # rank r is key r; query i sees i + 1
            seen = (i + 1)[None, None]
            bounds = (-(-(s[None, :] * seen[0, 0, :, None]) // SEGMENTS))[None, None]  # (1, 1, rows, S + 1)
            mask_cums = None
        else:
            mask = self._mask(r0, r1, keys)  # (1 or B, 1 or H, rows, K)
            seen = mask.sum(-1)
            mask_cums = mask.long().cumsum(-1)  # attended keys up to and including each key
            need = -(-(s * seen[..., None]) // SEGMENTS)  # the first rank of each segment
            bounds = torch.searchsorted(mask_cums, (need + 1).contiguous())  # the key of that rank
        q0 = r0 // self.block
        plan = _Plan(key=key, ranges=ranges, bounds=PrefixIndex.of(bounds, keys),
                     qualifies=(seen >= SEGMENTS).double(), looks=(seen > 0).double(), q0=q0,
                     q1=(r1 - 1) // self.block + 1, qblock=i // self.block - q0, mask_cums=mask_cums)  # fmt: skip
        self._planned = plan
        return plan

    def add(self, first: int, r0: int, weights: torch.Tensor) -> None:
        """Samples ``first ..``'s weights (B, H, rows, K) of query rows ``r0 ..`` against keys ``0 .. K - 1``, 0
        where a query does not look (the rows of every sample come exactly once, in any order)."""
        b, _, rows, keys = weights.shape
        self._first = first
        plan = self._plan(r0, rows, keys)
        at = slice(first, first + b)
        self.diagonals.add(first, r0, weights)  # the band masses: each bin's distances summed at the end
        starts = prefix_sums(weights, plan.bounds)  # Σ before each segment's first key
        segment = starts[..., 1:] - starts[..., :-1]
        self._put(self.context, (at,), (segment * plan.qualifies[..., None]).sum(-2))
        entropy = row_entropy(weights, self._scratch).double()  # (B, H, rows)
        by_block = torch.zeros(b, self.heads, plan.q1 - plan.q0, dtype=torch.float64, device=self.device)
        by_block.index_add_(-1, plan.qblock, entropy * plan.looks)
        self._put(self.entropy, (at, slice(None), slice(plan.q0, plan.q1)), by_block)
        self._put(self.columns, (at, slice(None), slice(0, keys)), weights.sum(-2).double())
        if first == 0 or self.by_samples:  # the counts come from the mask: once, or each sample's own
            sample = at if self.by_samples else slice(None)  # each sample's own, or the one count for all
            if plan.mask_cums is None:  # causal: a query i has keys at the bin's distances from distance lo on
                present = (plan.ranges[0][1] > plan.ranges[0][0])[None, None]
            else:
                present = self._range_sums(plan.mask_cums, plan.ranges) > 0
            self._put(self.band_queries, (sample,), present.double().sum(-2))
            self._put(self.context_queries, (sample,), plan.qualifies.sum(-1, keepdim=True))
            counts = torch.zeros(*plan.looks.shape[:2], plan.q1 - plan.q0, dtype=torch.float64, device=self.device)
            self._put(self.block_queries, (sample, slice(None), slice(plan.q0, plan.q1)),
                      counts.index_add_(-1, plan.qblock, plan.looks))  # fmt: skip
            if self.by_samples:  # the queries of each sample that see each key
                seen_by = self._mask(r0, r0 + rows, keys).sum(-2, dtype=torch.float64)
                self._put(self.key_counts, (at, slice(None), slice(0, keys)), seen_by)

    PER_SAMPLE = ("context", "entropy", "columns")
    COUNTS = ("band_queries", "context_queries", "block_queries")

    def sums(self) -> dict[str, torch.Tensor]:
        """This process's sums, on the CPU (torchrun: joined on process 0 by :meth:`join`)."""
        sums = {name: getattr(self, name).cpu() for name in (*self.PER_SAMPLE, *self.COUNTS)}
        return {**sums, "diagonals": self.diagonals.sums.cpu(), "diagonal_counts": self.diagonals.count.cpu()}

    def join(self, parts: list[dict[str, torch.Tensor]]) -> None:
        """Every process's :meth:`sums` in rank order: per-sample sums one after another, the mask's counts (the
        same in every process) from the first."""
        for name in self.PER_SAMPLE:
            setattr(self, name, torch.cat([p[name] for p in parts]).to(self.device))
        for name in self.COUNTS:
            setattr(self, name, parts[0][name].to(self.device))
        self.diagonals.sums = torch.cat([p["diagonals"] for p in parts]).to(self.device)
        self.diagonals.count = parts[0]["diagonal_counts"].to(self.device)
        self.n = len(self.columns)

    def per_key(self) -> torch.Tensor:
        """(1 or H, T): the queries that see each key; (N, H, T), each sample's, where samples are masked
        differently."""
        if self.by_samples:
            return self.key_counts
        if self.attended is not None:
            return self.attended.per_key.to(self.device)
        t = self.seq_len
        if not self.causal:
            return torch.full((1, t), float(t), dtype=torch.float64, device=self.device)
        return torch.arange(t, 0, -1, dtype=torch.float64, device=self.device)[None]

    def result(self) -> MeasureSummary:
        """The stored arrays: each measure's (mean, std) over samples, its SE (N >= 3), the sink keys, and the SE
        of the key profile and of the sink share."""
        out: dict[str, np.ndarray] = {}

        def per_query(total: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
            return torch.where(count > 0, total / count.clamp(min=1), float("nan"))

        by_distance = self.diagonals.distance_sums()  # (N, H, T)
        ends = torch.cat([torch.zeros_like(by_distance[..., :1]), by_distance.cumsum(-1)], -1)
        band = ends[..., self.hi + 1] - ends[..., self.lo]  # (N, H, bins): each bin's distances
        per_sample = {BAND_MASS: per_query(band, self.band_queries),
                      CONTEXT_MASS: per_query(self.context, self.context_queries),
                      WEIGHTS_ENTROPY: per_query(self.entropy, self.block_queries)}  # fmt: skip
        keys = self.per_key()
        seen = keys if keys.dim() == 3 else keys[None]  # (1 or N, 1 or H, T) the queries that see each key
        received = per_query(self.columns, seen)  # (N, H, T) mean received
        per_sample_key = received
        sink = received[..., 0]  # (N, H)
        for name, x in per_sample.items():
            stats, se = sample_stats(x)
            out[name] = stats.float().cpu().numpy()
            if se is not None:
                out[se_name(name)] = se.float().cpu().numpy()
        for name, x in ((se_name(KEY_PROFILE), per_sample_key), (se_name(SINK_SHARE), sink)):
            _, se = sample_stats(x)
            if se is not None:
                out[name] = se.float().cpu().numpy()
        se = self.diagonals.standard_error()
        if se is not None:
            out[se_name(profile_name("weights"))] = se.float().cpu().numpy()
        least = sink_min_queries(seen)
        ranked = seen >= least  # (1 or N, 1 or H, T): the keys each sample's ranking admits
        out[SINK_KEYS] = top_keys(received, ranked)
        out[SINK_KEYS_OF_MEAN] = top_keys(received.mean(0, keepdim=True), ranked.all(0, keepdim=True))[0]
        values = np.unique(least.cpu().numpy())
        out["sink_min_queries"] = (int(values[0]) if len(values) == 1 else
                                   np.broadcast_to(least[..., 0].cpu().numpy(), received.shape[:2]).astype(np.int64))
        return MeasureSummary(out)


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
