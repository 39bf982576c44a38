"""docs/position-measures.md's ``positional_frequency``: the positional logits P (docs/positional.md) split by rotary
pair and averaged over the attended cells of each distance bin, with its delete-one jackknife SE over samples, and the
SE of P's distance profile the same way.

P(i, j) − b̄(i, j) = c·(Q(i)·K(j) − G(i, j)) / (N(N − 1)) is a sum over the head's dims, so restricting the dot
products to a pair's two dims splits it exactly. Summed over the cells of one distance d, each term is a
cross-correlation along the positions: Σ_i Q(i)·K(i − d) for every d at once by FFT, O(T log T) per dim, and
G's Σ_a Σ_i q_a(i)·k_a(i − d) one per sample. Leaving sample a out changes Q, K and G by its own q_a and k_a
alone, so every delete-one P comes from the same transforms. Cells at a distance are all attended or none only
where the call's mask is a rule of distance (causal, every key, a sliding window); for other masks nothing is
stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from biasviz.adapters.rotary import RotaryLayout
from biasviz.common.shapes import gpu_shaped
from biasviz.store.datasets import MIN_SE_SAMPLES, POSITIONAL_FREQUENCY, POSITIONAL_PROFILE, distance_bins, se_name
from biasviz.store.format import POSITIONAL_FROM_KEYS
from biasviz.summaries.attended import Attended
from biasviz.summaries.frequency import FrequencyUse, frequency_from_bank

FIRST_KEYS = POSITIONAL_FROM_KEYS[1]  # P's profile is stored over all keys and over keys j >= 4


def cells_by_distance(seq_len: int, causal: bool, attended: Attended | None) -> torch.Tensor | None:
    """(1 or H, T): attended cells at each distance |i - j|, or None where the mask is no rule of distance (some
    distance partly attended)."""
    d = torch.arange(seq_len, dtype=torch.float64)
    full = (seq_len - d) * (1 if causal else 2)
    if not causal:
        full[0] = seq_len
    if attended is None:
        return full[None]
    if not causal:
        return None
    per = attended.per_distance.cpu()
    return per if bool(((per == 0) | (per == full)).all()) else None


class PairCorrelations:
    """Per head: each sample's sums over cells at each distance of q_a·K, Q·k_a and q_a·k_a by dim, reduced to
    pairs; enough for P by pair and distance and every delete-one P."""

    def __init__(self, layout: RotaryLayout, head_dim: int, seq_len: int, causal: bool) -> None:
        self.layout, self.seq_len, self.causal = layout, seq_len, causal
        r = layout.rotary_dims
        # each pair's two dims as two strided views of a head's rows, so that a pair's products are summed as they
        # are formed: no (dims, T + 1) product, no index_add (3x slower)
        self.first, self.second = layout.pair_dims()
        self.rest = slice(r, head_dim) if head_dim > r else None  # the dims not rotated: one group of their own
        self.pairs = r // 2 + int(self.rest is not None)

    def pair_products(self, x: torch.Tensor, y: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """(..., dims, T + 1) transforms x and y (y conjugated) -> (..., pairs, T + 1): Σ over each pair's dims of
        x·y, added to ``into`` where given; the dims not rotated summed as the last group. Leading axes (heads) are
        batched: one kernel each for all of them."""
        a, b, n = self.first, self.second, self.layout.rotary_dims // 2
        if into is None:
            out = x.new_empty(*x.shape[:-2], self.pairs, x.shape[-1])
            torch.mul(x[..., a, :], y[..., a, :], out=out[..., :n, :])
        else:
            out = into
            out[..., :n, :].addcmul_(x[..., a, :], y[..., a, :])
        out[..., :n, :].addcmul_(x[..., b, :], y[..., b, :])
        if self.rest is not None:
            rest = (x[..., self.rest, :] * y[..., self.rest, :]).sum(-2)
            out[..., n, :] = rest if into is None else out[..., n, :] + rest
        return out

    def lags(self, pair_spectrum: torch.Tensor) -> torch.Tensor:
        """(..., T + 1) products of transforms -> (..., T): the sums by distance d = |i - j| (causal: i - j = d
        only)."""
        t = self.seq_len
        lags = torch.fft.irfft(pair_spectrum, n=2 * t, dim=-1)  # (..., 2T): lag m = i - j (mod 2T)
        total = lags[..., :t].clone()  # i - j = d >= 0
        if not self.causal:
            total[..., 1:] += lags[..., t + 1 :].flip(-1)  # j - i = e > 0 at 2T - e
        return total

    def binned(self, by_bin: torch.Tensor) -> torch.Tensor:
        """(bins, T) 0/1 by distance -> (T + 1, bins) complex W with Re(X @ W) = :meth:`lags` (X) @ by_bin.T for any
        products X (..., T + 1): the inverse transform and the bins' sums as one small product (Parseval), for the
        per-sample terms that are only ever summed by bin.

        With n = 2T, irfft(X)[m] = (1/n) Σ_f c_f Re(X_f e^{2πi f m / n}), c_f = 1 at f = 0 and T, 2 between; summed
        over the lags m of a bin, the exponentials sum to conj(rfft(the bin's 0/1 lags))_f."""
        t = self.seq_len
        at_lag = by_bin.new_zeros(by_bin.shape[0], 2 * t)
        at_lag[:, :t] = by_bin
        if not self.causal:
            at_lag[:, t + 1 :] = by_bin[:, 1:].flip(-1)  # j - i = e > 0 at lag 2T - e
        c = torch.full((t + 1,), 2.0, dtype=torch.float64, device=by_bin.device)
        c[0] = c[-1] = 1.0
        return (torch.fft.rfft(at_lag, dim=-1).conj() * (c / (2 * t))).T.contiguous()

    @staticmethod
    def positions_last(x: torch.Tensor, step: int = 256) -> torch.Tensor:
        """(T, ..., dims) positions first -> (..., dims, T) float64, contiguous: what :meth:`transform` takes.

        Positions last because (64, 8192) float64 transformed along its rows took 0.9 ms, along the columns of
        (8192, 64) 2.2 ms (one head of GPT-2-small's shape at T = 4096); copied ``step`` positions at a time, which
        keeps the transposition in the cache: 2.8 ms for a sample's 12 heads at 4096, 11.7 in one copy, 19.8 a head
        at a time (on the CPU; a GPU's one copy is one kernel)."""
        if gpu_shaped(x.device):
            return x.movedim(0, -1).to(torch.float64, memory_format=torch.contiguous_format)
        out = torch.empty(*x.shape[1:], x.shape[0], dtype=torch.float64, device=x.device)
        for t0 in range(0, x.shape[0], step):
            out[..., t0 : t0 + step] = x[t0 : t0 + step].movedim(0, -1)
        return out

    def transform(self, rows: torch.Tensor) -> torch.Tensor:
        """(..., dims, T) from :meth:`positions_last` -> its zero-padded transform (..., dims, T + 1), for
        :meth:`pair_products`."""
        return torch.fft.rfft(rows, n=2 * self.seq_len, dim=-1)


def jackknife(theta: torch.Tensor) -> torch.Tensor:
    """Delete-one estimates (N, ...) -> the jackknife SE √((N − 1)/N · Σ_a (θ_(−a) − mean θ_(−a))²)."""
    n = theta.shape[0]
    return torch.sqrt((n - 1) / n * (theta - theta.mean(0)).square().sum(0))


def bin_matrix(seq_len: int) -> torch.Tensor:
    """(bins, T) float64: 1 where distance d falls in bin b of :func:`~biasviz.store.datasets.distance_bins`."""
    bins = torch.from_numpy(distance_bins(seq_len))
    d = torch.arange(seq_len)
    return ((d >= bins[:, :1]) & (d <= bins[:, 1:])).double()  # two comparisons, not a write a bin


def _per_bin(sums: torch.Tensor, by_bin: torch.Tensor, bin_cells: torch.Tensor) -> torch.Tensor:
    """Sums over the cells of each distance (..., T) -> means over each bin's cells (..., bins), NaN with none."""
    return torch.where(bin_cells > 0, sums @ by_bin.T / bin_cells.clamp(min=1), float("nan"))


def positional_frequency(layout: RotaryLayout | None, bank: Any, layer: int, *, heads: int, scale: float,
                         causal: bool, attended: Attended | None, use: FrequencyUse | None = None,
                         bias: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """``positional_frequency`` (H, pairs, bins), its SE and ``positional_profile_se`` (H, T) from every sample's q
    and k in the bank; {} without a rotary layout, two samples, or a mask that is a rule of distance.

    One pass over the samples, one at a time, so that memory does not grow with N: the sums of q and k over the
    samples come first (their transforms give Q·K by distance); each sample's transforms then give its share of
    G (q_a·k_a) and what leaving it out takes away (q_a·K + Q·k_a − 2 q_a·k_a), kept only by bin and summed over
    the pairs by distance; the pairs' norms (``use``) come from the same reads. ``bias``: where the call adds one,
    each sample's sums of it (N, H, T) by distance over all cells and over the first keys j < 4, so that the profile's
    delete-one P holds the mean bias of the others; the split by pair is of P − b̄ alone."""
    n = bank.samples
    t = bank.seq_len(layer, "q")
    cells = cells_by_distance(t, causal, attended)
    if layout is None or n < 2 or cells is None:
        return {}

    def operands(a: int) -> tuple[torch.Tensor, torch.Tensor]:
        return tuple(bank.get(layer, name, a, 0, t).view(t, heads, -1) for name in ("q", "k"))  # type: ignore

    sum_q, sum_k = (bank.sample_sum(layer, name, heads) for name in ("q", "k"))  # (T, H, hd) float64
    dev = sum_q.device  # the bank's (a GPU's): every sum and transform is formed there, only results come back
    f64 = {"dtype": torch.float64, "device": dev}
    errors = n >= MIN_SE_SAMPLES
    early = _FirstKeys(sum_q, sum_k, n if errors else 0)  # the profile's second row leaves out keys j < 4
    corr = PairCorrelations(layout, sum_q.shape[-1], t, causal)
    fq, fk = (corr.transform(corr.positions_last(x)) for x in (sum_q, sum_k))  # (H, hd, T + 1)
    del sum_q, sum_k
    fk = fk.conj_physical_()  # K only ever enters conjugated
    # heads at a time: all of them on a GPU (a few kernels a sample), one on a CPU (a head's transforms in its cache)
    group = heads if gpu_shaped(dev) else 1
    cross = torch.cat([corr.lags(corr.pair_products(fq[h : h + group], fk[h : h + group]))
                       for h in range(0, heads, group)])  # (H, pairs, T)
    by_bin = bin_matrix(t).to(dev)  # which distances each bin sums
    to_bins = corr.binned(by_bin)  # (T + 1, bins): a sample's lost products straight to its bins
    n_cells = cells.to(dev).expand(heads, -1)  # (H, T)
    bin_cells = n_cells @ by_bin.T  # (H, bins)
    # G's transform by pair, summed over the samples: one inverse transform per head at the end, not per sample
    same_hat = torch.zeros(heads, corr.pairs, t + 1, dtype=torch.complex128, device=dev)
    lost_bins = torch.zeros(n if errors else 0, heads, corr.pairs, len(by_bin), **f64)  # by bin, summed
    lost_profile = torch.zeros(n if errors else 0, heads, t, **f64)  # by distance, the pairs summed
    for a in range(n):
        q, k = operands(a)
        if use is not None:
            use.add(a, q.permute(1, 0, 2)[None], k.permute(1, 0, 2)[None])
        early.add(a, q, k)
        q, k = corr.positions_last(q), corr.positions_last(k)  # (H, hd, T)
        for h0 in range(0, heads, group):
            h = slice(h0, h0 + group)
            qa, ka = corr.transform(q[h]), corr.transform(k[h]).conj_physical_()  # (group, hd, T + 1)
            own = corr.pair_products(qa, ka)
            same_hat[h] += own
            if errors:  # Q - q_a, K - k_a: the cross loses q_a·K + Q·k_a - q_a·k_a, G loses q_a·k_a
                lost = corr.pair_products(fq[h], ka, corr.pair_products(qa, fk[h])).sub_(own, alpha=2.0)
                lost_bins[a, h] = (lost @ to_bins).real
                lost_profile[a, h] = corr.lags(lost.sum(-2))
    same = corr.lags(same_hat)  # (H, pairs, T): G by pair and distance
    del same_hat, fq, fk
    kept = cross - same  # (H, pairs, T): N(N - 1)(P - b̄) / c, summed over each distance's cells
    got = {POSITIONAL_FREQUENCY: _per_bin(scale * kept / (n * (n - 1)), by_bin, bin_cells[:, None])}
    if errors:
        denom = scale / ((n - 1) * (n - 2))
        left_bins = (kept @ by_bin.T - lost_bins) * denom  # (N, H, pairs, bins): each delete-one P, summed by bin
        left_bins = torch.where(bin_cells[:, None] > 0, left_bins / bin_cells[:, None].clamp(min=1), float("nan"))
        left_profile = (kept.sum(1) - lost_profile) * denom  # (N, H, T)
        # over keys j >= 4 (the profile's second row): the cells of keys j < 4 at each distance taken away
        rest_cells = n_cells - torch.where(n_cells > 0, early.cells(t).to(dev), 0.0)
        left_rest = left_profile - (early.kept() - early.lost) * denom
        if bias is not None:  # the others' mean bias, (N b̄ − b_a) / (N − 1), summed over the same cells
            every, first = (x.to(dev, torch.float64) for x in bias)
            left_profile = left_profile + (every.sum(0) - every) / (n - 1)
            left_rest = left_rest + (every.sum(0) - every - first.sum(0) + first) / (n - 1)
        left_profile = torch.where(n_cells > 0, left_profile / n_cells.clamp(min=1), float("nan"))
        left_rest = torch.where(rest_cells > 0, left_rest / rest_cells.clamp(min=1), float("nan"))
        got[se_name(POSITIONAL_FREQUENCY)] = jackknife(left_bins)
        got[se_name(POSITIONAL_PROFILE)] = torch.stack([jackknife(left_profile), jackknife(left_rest)])  # (2, H, T)
    return {name: x.float().cpu().numpy() for name, x in got.items()}


class _FirstKeys:
    """By distance, the sums over the cells (i, j) of the first keys j < 4 of Q·K − G and of what leaving each sample
    out takes away from them (q_a·K + Q·k_a − 2 q_a·k_a), formed cell by cell: 4 keys a query, whatever T."""

    def __init__(self, sum_q: torch.Tensor, sum_k: torch.Tensor, samples: int) -> None:
        t, heads = sum_q.shape[:2]
        self.first = min(FIRST_KEYS, t)
        self.q = sum_q.transpose(0, 1)  # (H, T, hd) float64: Q
        self.k = sum_k[: self.first].transpose(0, 1)  # (H, first, hd): K of the first keys
        self.cross = _by_distance(self.q @ self.k.transpose(1, 2))  # (H, T): Q·K
        self.same = torch.zeros_like(self.cross)  # G
        self.lost = torch.zeros(samples, heads, t, dtype=torch.float64, device=sum_q.device)

    def add(self, a: int, q: torch.Tensor, k: torch.Tensor) -> None:
        """Sample a's q (T, H, hd) and k (T, H, hd), as the bank holds them."""
        qa, ka = q.transpose(0, 1).double(), k[: self.first].transpose(0, 1).double()
        own = qa @ ka.transpose(1, 2)  # (H, T, first)
        self.same += _by_distance(own)
        if len(self.lost):
            lost = (qa @ self.k.transpose(1, 2)).add_(self.q @ ka.transpose(1, 2)).sub_(own, alpha=2.0)
            self.lost[a] = _by_distance(lost)

    def kept(self) -> torch.Tensor:
        return self.cross - self.same

    def cells(self, t: int) -> torch.Tensor:
        """(T,): the first keys' causal cells at each distance."""
        d = torch.arange(t, dtype=torch.float64)
        return (t - d).clamp(max=self.first)


def _by_distance(cells: torch.Tensor) -> torch.Tensor:
    """(H, T, F) values of the cells (i, j), j < F, -> (H, T) their sums by distance d = i - j (cells j <= i)."""
    t = cells.shape[1]
    out = cells.new_zeros(cells.shape[0], t)
    for j in range(min(cells.shape[-1], t)):
        out[:, : t - j] += cells[:, j:, j]
    return out


def rotary_measures(adapter: Any, bank: Any, layer: int, heads: int, attended: Attended | None, positional: bool,
                    own: bool = False,
                    bias: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """A replayed layer's docs/position-measures.md measures of its rotary pairs: ``frequency_use`` and (``positional``)
    ``positional_frequency`` with their SEs, and the SE of P's profile (``bias``: where the call adds a bias that
    differs by sample, each sample's sums of it by distance, as :func:`positional_frequency` takes them); {} where the
    call rotates nothing but P's profile SE. ``own``: samples masked differently, the norms over each sample's own
    positions and nothing of P, which pairs the cells of different samples as one grid."""
    layout = adapter.rotary(layer)
    if layout is None:  # P's profile SE alone, its dims as one group
        if not positional or own:
            return {}
        alone = positional_frequency(RotaryLayout(interleaved=False, rotary_dims=0), bank, layer, heads=heads,
                                     scale=adapter.score_scale(layer), causal=True, attended=attended,
                                     bias=bias)  # fmt: skip
        return {name: x for name, x in alone.items() if name == se_name(POSITIONAL_PROFILE)}
    use = FrequencyUse(layout, bank.samples)  # fed by P's first pass over the samples, where P is split
    split = {}
    if positional and not own:
        split = positional_frequency(layout, bank, layer, heads=heads, scale=adapter.score_scale(layer), causal=True,
                                     attended=attended, use=use, bias=bias)  # fmt: skip
    if use.per_sample is None:  # no pass was made for P: the norms alone
        frequency_from_bank(bank, layer, heads, use, None if attended is None or own else attended.mask, own=own)
    return {**use.result(), **split}


def add_pair_sum_residual(measures: dict[str, Any], p_by_distance: torch.Tensor, attended: Attended | None) -> None:
    """``positional_frequency``'s pairs summed against P (its distance profile, formed from the sums of q and k block
    by block: another computation) over each bin's cells: max |difference| / max |P| as the attribute
    ``pair_sum_residual`` (for a model that adds no bias, P - mean bias is P)."""
    split = measures.get(POSITIONAL_FREQUENCY)
    if split is None:
        return
    t = p_by_distance.shape[-1]
    cells = cells_by_distance(t, True, attended)
    assert cells is not None, f"{POSITIONAL_FREQUENCY} is stored only where the mask is a rule of distance"
    p = torch.as_tensor(p_by_distance).to("cpu", torch.float64).nan_to_num()  # P's profile may be on a GPU
    by_bin = bin_matrix(t)
    bin_cells = by_bin @ cells.T  # (bins, 1 or H)
    mean = ((p * cells) @ by_bin.T) / bin_cells.T.clamp(min=1)  # (H, bins)
    summed = torch.as_tensor(split, dtype=torch.float64).sum(1)
    valid = bin_cells.T.expand_as(mean) > 0
    scale = float(mean[valid].abs().max()) if valid.any() else 0.0
    gap = float((summed - mean)[valid].abs().max()) if valid.any() else 0.0
    measures["pair_sum_residual"] = gap / scale if scale > 0 else gap
