"""docs/position-measures.md's measures written out query by query in float64, for tests to compare biasviz's with."""

from __future__ import annotations

import math

import numpy as np

from biasviz.store.datasets import SEGMENTS, distance_bins


def reference(w: np.ndarray, mask: np.ndarray, block: int) -> dict[str, np.ndarray]:
    """Per sample, from weights (N, H, T, T) and the attended cells (H or 1, T, T): band mass, context mass, entropy
    block means, the mean received weight per key and the mean attention distance, by docs/position-measures.md's
    definitions, one query at a time."""
    n, h, t, _ = w.shape
    bins = distance_bins(t)
    m = np.broadcast_to(mask, (h, t, t))
    band = np.full((n, h, len(bins)), np.nan)
    context = np.full((n, h, SEGMENTS), np.nan)
    nqb = -(-t // block)
    entropy = np.full((n, h, nqb), np.nan)
    received = np.full((n, h, t), np.nan)
    distance = np.full((n, h), np.nan)
    for a in range(n):
        for hh in range(h):
            looked = [sum(w[a, hh, i, j] * abs(i - j) for j in range(t) if m[hh, i, j]) for i in range(t)
                      if m[hh, i].any()]  # fmt: skip
            if looked:
                distance[a, hh] = np.mean(looked)
            for b, (lo, hi) in enumerate(bins):
                vals = []
                for i in range(t):
                    keys = [j for j in range(t) if m[hh, i, j] and lo <= abs(i - j) <= hi]
                    if keys:
                        vals.append(sum(w[a, hh, i, j] for j in keys))
                if vals:
                    band[a, hh, b] = np.mean(vals)
            segs = []
            for i in range(t):
                keys = [j for j in range(t) if m[hh, i, j]]
                if len(keys) >= SEGMENTS:
                    row = np.zeros(SEGMENTS)
                    for r, j in enumerate(keys):
                        row[math.floor(SEGMENTS * r / len(keys))] += w[a, hh, i, j]
                    segs.append(row)
            if segs:
                context[a, hh] = np.mean(segs, axis=0)
            for qb in range(nqb):
                ents = [-sum(x * math.log(x) for x in w[a, hh, i] if x > 0)
                        for i in range(qb * block, min(t, qb * block + block)) if m[hh, i].any()]  # fmt: skip
                if ents:
                    entropy[a, hh, qb] = np.mean(ents)
            for j in range(t):
                qs = [i for i in range(t) if m[hh, i, j]]
                if qs:
                    received[a, hh, j] = np.mean([w[a, hh, i, j] for i in qs])
    seen = m.sum(1).astype(np.int64)  # (H, T): the queries that see each key
    return {"band_mass": band, "context_mass": context, "weights_entropy": entropy, "received": received,
            "seen": seen, "attention_distance": distance}


def sink_ranking(received: np.ndarray, seen: np.ndarray, ranks: int = 8) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(N, H, T) mean received weight, (H, T) queries that see each key -> the top ``ranks`` keys of each (sample,
    head) among the keys seen by at least ceil(m / 8) queries, m the most any key is seen by: indices (N, H, ranks)
    (-1 past the keys that qualify), shares (NaN there), and the threshold per head, written out key by key."""
    n, h, t = received.shape
    index = np.full((n, h, ranks), -1)
    share = np.full((n, h, ranks), np.nan)
    least = np.zeros(h, dtype=np.int64)
    for hh in range(h):
        least[hh] = math.ceil(max(seen[hh]) / 8)
        keys = [j for j in range(t) if seen[hh, j] >= least[hh]]
        for a in range(n):
            order = sorted(keys, key=lambda j: (-received[a, hh, j], j))[:ranks]
            index[a, hh, : len(order)] = order
            share[a, hh, : len(order)] = [received[a, hh, j] for j in order]
    return index, share, least


def block_means(x: np.ndarray, mask: np.ndarray, block: int) -> np.ndarray:
    """(N, H, T, T) values, (1 or H, T, T) attended cells -> (N, H, nb, nb) each sample's mean over a block's attended
    cells (NaN where it has none)."""
    n, h, t, _ = x.shape
    m = np.broadcast_to(mask, (h, t, t))
    nb = -(-t // block)
    per = np.full((n, h, nb, nb), np.nan)
    for qb in range(nb):
        for kb in range(nb):
            rows, keys = slice(qb * block, (qb + 1) * block), slice(kb * block, (kb + 1) * block)
            cells = m[:, rows, keys]  # (h, r, k)
            count = cells.sum((-1, -2))
            total = np.where(cells[None], x[:, :, rows, keys], 0.0).sum((-1, -2))
            per[:, :, qb, kb] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return per


def map_se(x: np.ndarray, mask: np.ndarray, block: int) -> np.ndarray:
    """(H, nb, nb): the SE over samples of each sample's block mean, sqrt(Σ (x_a - x̄)² / (N (N - 1)))."""
    per = block_means(x, mask, block)
    n = len(per)
    return np.sqrt(((per - per.mean(0)) ** 2).sum(0) / (n * (n - 1)))
