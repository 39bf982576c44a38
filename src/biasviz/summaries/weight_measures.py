"""SPEC section 14's measures of the weights, from each sample's rows as they are formed: how far a head looks
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

from biasviz.store.datasets import MIN_SE_SAMPLES, SEGMENTS, SINK_DTYPE, SINK_RANKS, distance_bins
from biasviz.summaries.attended import Attended


@dataclass
class MeasureSummary:
    """What a file keeps of SPEC section 14's weight measures for one layer: name -> array (see store.datasets)."""

    arrays: dict[str, np.ndarray]


def sample_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-sample values (N, ...) -> ((2, ...) mean and std over samples (ddof 0), SE or None with N < 3).

    The SE sqrt(Σ (x_a - x̄)² / (N (N - 1))) is the delete-one jackknife of a mean. NaN in a sample (nothing
    attended there) leaves that entry NaN."""
    n = x.shape[0]
    mean = x.mean(0)
    dev2 = (x - mean).square().sum(0)
    std = (dev2 / n).sqrt()
    se = (dev2 / (n * (n - 1))).sqrt() if n >= MIN_SE_SAMPLES else None
    return torch.stack([mean, std]), se


class WeightMeasures:
    """One layer's per-sample sums for band mass, context mass, entropy and the keys' received weight."""

    def __init__(self, *, samples: int, heads: int, seq_len: int, block: int, causal: bool,
                 device: torch.device, attended: Attended | None = None) -> None:  # fmt: skip
        self.n, self.heads, self.seq_len, self.block, self.causal = samples, heads, seq_len, block, causal
        self.attended, self.device = attended, device
        bins = torch.as_tensor(distance_bins(seq_len), device=device)
        self.lo, self.hi = bins[:, 0], bins[:, 1]
        nqb = -(-seq_len // block)
        f64 = {"dtype": torch.float64, "device": device}
        self.band = torch.zeros(samples, heads, len(bins), **f64)
        self.context = torch.zeros(samples, heads, SEGMENTS, **f64)
        self.entropy = torch.zeros(samples, heads, nqb, **f64)
        self.columns = torch.zeros(samples, heads, seq_len, **f64)  # Σ_i w_a(i, j)
        heads_of_mask = 1 if attended is None else attended.mask.shape[0]
        # queries (same for every sample, from the mask) that have keys in each bin / see >= 10 keys / see any
        self.band_queries = torch.zeros(heads_of_mask, len(bins), **f64)
        self.context_queries = torch.zeros(heads_of_mask, 1, **f64)
        self.block_queries = torch.zeros(heads_of_mask, nqb, **f64)
        self._pending: list[tuple[torch.Tensor, tuple, torch.Tensor]] | None = None  # (sum, where, amount)

    def hold(self) -> None:
        """From here on, additions wait for :meth:`commit` (or are dropped by :meth:`discard`): a block that may be
        formed again (a bias measured to differ) counts once."""
        self._pending = []

    def commit(self) -> None:
        for total, where, amount in self._pending or ():
            total[where] += amount
        self._pending = None

    def discard(self) -> None:
        self._pending = None

    def _put(self, total: torch.Tensor, where: tuple, amount: torch.Tensor) -> None:
        if self._pending is None:
            total[where] += amount
        else:
            self._pending.append((total, where, amount))

    def _mask(self, r0: int, r1: int, keys: int) -> torch.Tensor:
        """(1 or H, rows, keys) bool: the cells the call attends to."""
        if self.attended is not None:
            return self.attended.rows(r0, r1, keys).to(self.device)
        if not self.causal:
            return torch.ones(1, r1 - r0, keys, dtype=torch.bool, device=self.device)
        i = torch.arange(r0, r1, device=self.device)[:, None]
        return (torch.arange(keys, device=self.device)[None, :] <= i)[None]

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
    def _range_sums(prefix: torch.Tensor, ranges: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Σ over keys in each range, from ``prefix`` (..., rows, K + 1) with prefix[..., k] = Σ_{j < k}."""
        total = None
        for a, b in ranges:
            lead = prefix.shape[:-2]
            idx_a, idx_b = (t.expand(*lead, *t.shape) for t in (a, b))
            part = prefix.gather(-1, idx_b) - prefix.gather(-1, idx_a)
            total = part if total is None else total + part
        assert total is not None
        return total

    def add(self, first: int, r0: int, weights: torch.Tensor) -> None:
        """Samples ``first ..``'s weights (B, H, rows, K) of query rows ``r0 ..`` against keys ``0 .. K - 1``, 0
        where a query does not look (the rows of every sample come exactly once, in any order)."""
        b, _, rows, keys = weights.shape
        r1 = r0 + rows
        w = weights.double()
        mask = self._mask(r0, r1, keys)  # (1 or H, rows, K)
        prefix = torch.nn.functional.pad(w.cumsum(-1), (1, 0))  # (B, H, rows, K + 1)
        at = slice(first, first + b)
        ranges = self._band_ranges(r0, r1, keys)
        self._put(self.band, (at,), self._range_sums(prefix, ranges).sum(-2))
        seen = mask.sum(-1)  # (1 or H, rows): keys each query sees
        ranks = mask.long().cumsum(-1)  # attended keys up to and including each key
        s = torch.arange(SEGMENTS + 1, device=self.device)
        need = -(-(s[None, None, :] * seen[..., None]) // SEGMENTS)  # first rank of each segment (ceil)
        bounds = torch.searchsorted(ranks.contiguous(), (need + 1).contiguous())  # (1 or H, rows, S + 1) key index
        segment = prefix.gather(-1, bounds[..., 1:].expand(b, self.heads, -1, -1)) - prefix.gather(
            -1, bounds[..., :-1].expand(b, self.heads, -1, -1))  # fmt: skip
        qualifies = (seen >= SEGMENTS).double()  # (1 or H, rows)
        self._put(self.context, (at,), (segment * qualifies[None, ..., None]).sum(-2))
        entropy = torch.special.entr(w).sum(-1)  # (B, H, rows)
        q0, q1 = r0 // self.block, (r1 - 1) // self.block + 1
        qblock = torch.arange(r0, r1, device=self.device) // self.block - q0
        looks = (seen > 0).double()
        by_block = torch.zeros(b, self.heads, q1 - q0, dtype=torch.float64, device=self.device)
        self._put(self.entropy, (at, slice(None), slice(q0, q1)), by_block.index_add_(-1, qblock, entropy * looks))
        self._put(self.columns, (at, slice(None), slice(0, keys)), w.sum(-2))
        if first == 0:  # the counts come from the mask, the same for every sample: once
            present = self._range_sums(torch.nn.functional.pad(mask.double().cumsum(-1), (1, 0)), ranges) > 0
            self._put(self.band_queries, (), present.double().sum(-2))
            self._put(self.context_queries, (), qualifies.sum(-1, keepdim=True))
            counts = torch.zeros(looks.shape[0], q1 - q0, dtype=torch.float64, device=self.device)
            self._put(self.block_queries, (slice(None), slice(q0, q1)), counts.index_add_(-1, qblock, looks))

    PER_SAMPLE = ("band", "context", "entropy", "columns")
    COUNTS = ("band_queries", "context_queries", "block_queries")

    def sums(self) -> dict[str, torch.Tensor]:
        """This process's sums, on the CPU (torchrun: joined on process 0 by :meth:`join`)."""
        return {name: getattr(self, name).cpu() for name in (*self.PER_SAMPLE, *self.COUNTS)}

    def join(self, parts: list[dict[str, torch.Tensor]]) -> None:
        """Every process's :meth:`sums` in rank order: per-sample sums one after another, the mask's counts (the
        same in every process) from the first."""
        for name in self.PER_SAMPLE:
            setattr(self, name, torch.cat([p[name] for p in parts]).to(self.device))
        for name in self.COUNTS:
            setattr(self, name, parts[0][name].to(self.device))
        self.n = len(self.band)

    def per_key(self) -> torch.Tensor:
        """(1 or H, T): the queries that see each key."""
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

        per_sample = {"band_mass": per_query(self.band, self.band_queries[None]),
                      "context_mass": per_query(self.context, self.context_queries[None]),
                      "weights_entropy": per_query(self.entropy, self.block_queries[None])}  # fmt: skip
        received = per_query(self.columns, self.per_key()[None])  # (N, H, T) mean received weight
        per_sample_key = received
        sink = received[..., 0]  # (N, H)
        for name, x in per_sample.items():
            stats, se = sample_stats(x)
            out[name] = stats.float().cpu().numpy()
            if se is not None:
                out[f"{name}_se"] = se.float().cpu().numpy()
        for name, x in (("weights_key_profile_se", per_sample_key), ("sink_share_se", sink)):
            _, se = sample_stats(x)
            if se is not None:
                out[name] = se.float().cpu().numpy()
        out["sink_keys"] = top_keys(received)
        return MeasureSummary(out)


def top_keys(received: torch.Tensor) -> np.ndarray:
    """(N, H, T) mean received weight -> (N, H, 8) records (index, share), highest first; keys no query sees are
    left out; fewer than 8 keys: index -1, share NaN."""
    n, h, t = received.shape
    ranked = torch.nan_to_num(received, nan=-1.0)
    k = min(SINK_RANKS, t)
    share, index = ranked.topk(k, dim=-1)
    out = np.zeros((n, h, SINK_RANKS), dtype=SINK_DTYPE)
    out["index"] = -1
    out["share"] = np.nan
    keep = (share >= 0).cpu().numpy()
    out["index"][..., :k] = np.where(keep, index.cpu().numpy(), -1)
    out["share"][..., :k] = np.where(keep, share.float().cpu().numpy(), np.nan)
    return out
