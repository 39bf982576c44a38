"""The fused statistics' accumulators formed in float64 numpy, every cell of every sample in full: what the kernels of
:mod:`biasviz.summaries.kernels` must add up to, from the same q, k and bias of distance (or of the key).

Notation: sample a of N, head h (key head h // group), query i, key j <= i (causal), d = i - j, c the call's scale,
s_a(i, j) = c q_a(i)·k_a(j) + b_h(i, j), b a table of distance f_h(d) or (``keys``) a row of keys g_h(j),
w_a = softmax_j(z_a) with z = s or (``softcap``) cap·tanh(s / cap), beside each row's sink logit (``sinks``, (N, T, H))
where given, x̄ and σ_x the mean and population spread over samples, Q = Σ_a q_a and K = Σ_a k_a (of the key
head), maps of ``block`` x ``block`` positions (nb of them a side).
"""

from __future__ import annotations

from typing import Any

import numpy as np

SEGMENTS = 10


def window(t: int, width: int) -> np.ndarray:
    """(T, T) bool: a sliding window, the keys j with i - width < j <= i."""
    i, j = np.indices((t, t))
    return (j <= i) & (j > i - width)


def documents(t: int, starts: list[int]) -> np.ndarray:
    """(T, T) bool: packed documents starting at ``starts`` (causal within each, one mask for every sample)."""
    doc = np.searchsorted(starts, np.arange(t), side="right")
    i, j = np.indices((t, t))
    return (j <= i) & (doc[:, None] == doc[None, :])


def padded(t: int, left: list[int], right: list[int]) -> np.ndarray:
    """(N, T, T) bool: each sample's causal cells among its own positions, ``left[a]`` padded before them and
    ``right[a]`` after (a padded query sees no key, a padded key is seen by none)."""
    i, j = np.indices((t, t))
    own = [(j <= i) & (j >= lo) & (i >= lo) & (i < t - hi) for lo, hi in zip(left, right, strict=True)]
    return np.stack(own)


def mlp_cells(mlp: Any, t: int) -> np.ndarray:
    """(H, T, T) float64 FIRE's b_h(i, j) = b2_h + Σ_k W2_hk max(W1_k u + b1_k, 0), u = ψ(max(i - j, 0)) / ψ(max(L, i)),
    from an :class:`~biasviz.summaries.kernels.biases.MlpBias`'s tables and weights."""
    psi_d, psi_i, w1, b1, w2, b2 = (np.asarray(x.detach().double().cpu()) for x in mlp)
    i, j = np.indices((t, t))
    u = psi_d[np.clip(i - j, 0, None)] / psi_i[i]
    hidden = np.maximum(u[..., None] * w1 + b1, 0.0)  # (T, T, hidden)
    return np.moveaxis(hidden @ w2.T + b2, -1, 0)


def _bias(table: np.ndarray | None, t: int, keys: bool) -> np.ndarray | float:
    """(H, T, T) b(i, j) from ``table`` (H, T): f(i - j) (0 past the diagonal: never used) or, ``keys``, g(j); or
    ``table`` itself where it is (H, T, T) already, a bias of each cell, or (N, H, T, T), each sample's own."""
    if table is None:
        return 0.0
    if table.ndim >= 3:
        return table
    i, j = np.indices((t, t))
    return table[:, np.broadcast_to(j, (t, t))] if keys else table[:, np.clip(i - j, 0, None)]


def formed(q: np.ndarray, k: np.ndarray, table: np.ndarray | None, scale: float,
           cells: np.ndarray | None = None, keys: bool = False, softcap: float | None = None,
           sinks: np.ndarray | None = None) -> tuple[np.ndarray, ...]:  # fmt: skip
    """(used (T, T), scores (N, H, T, T) 0 past the diagonal, weights, lse (N, H, T), bias (H, T, T) or zeros);
    ``cells`` (T, T) bool: the cells attended, one mask for every sample, or (N, T, T) each sample's own (used is then
    (N, 1, T, T); a row with no key and no sink has lse 0) (None: j <= i). The weights are the softmax of z (s, or
    ``softcap``'s cap·tanh(s / cap)) over the attended keys and (``sinks`` (N, T, H)) each row's sink logit."""
    n, heads, t, _ = q.shape
    k = np.repeat(k, heads // k.shape[1], axis=1)
    i, j = np.indices((t, t))
    used = j <= i if cells is None else np.asarray(cells, bool)
    if used.ndim == 3:
        used = used[:, None]
    bias = _bias(table, t, keys) + np.zeros((heads, t, t))
    s = scale * np.einsum("nhid,nhjd->nhij", q, k) + (bias if bias.ndim == 4 else bias[None])
    z = np.where(used, s if softcap is None else softcap * np.tanh(s / softcap), -np.inf)
    if sinks is not None:  # the sink as one more column, every row's
        z = np.concatenate([z, np.broadcast_to(sinks.transpose(0, 2, 1)[..., None], (*z.shape[:-1], 1))], -1)
    seen = np.isfinite(z).any(-1, keepdims=True)
    top = np.where(seen, np.where(np.isfinite(z), z, -np.inf).max(-1, keepdims=True), 0.0)
    total = np.where(seen, np.exp(z - top).sum(-1, keepdims=True), 1.0)
    lse = np.where(seen, np.log(total) + top, 0.0)[..., 0]
    z = z[..., :t]
    w = np.where(used, np.exp(z - lse[..., None]), 0.0)
    return used, np.where(used, s, 0.0), w, lse, np.where(used, bias, 0.0)


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    """(..., T, T) -> (..., nb, nb) sums over each block's cells."""
    t = x.shape[-1]
    nb = -(-t // block)
    pad = nb * block - t
    x = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, pad), (0, pad)])
    return x.reshape(*x.shape[:-2], nb, block, nb, block).sum((-3, -1))


def _by_distance(x: np.ndarray) -> np.ndarray:
    """(..., T, T) -> (..., T): Σ_i x(i, i - d)."""
    t = x.shape[-1]
    return np.stack([np.trace(x, offset=-d, axis1=-2, axis2=-1) for d in range(t)], -1)


def own_bias_sums(bias: np.ndarray, used: np.ndarray, block: int) -> dict[str, np.ndarray]:
    """A bias of each sample's own, ``bias`` (N, H, T, T), summarised over samples and the causal cells (``used``):
    the accumulators of :func:`accumulators`' ``bias_*``."""
    t = bias.shape[-1]
    mean, std = np.where(used, bias.mean(0), 0.0), np.where(used, bias.std(0), 0.0)
    i, j = np.indices((t, t))
    first = mean[:, np.clip(i - j, 0, None), 0]  # each diagonal's first cell b̄(d, 0)
    dev = np.where(used, mean - first, 0.0)
    lower = j < i
    diag = np.diagonal(mean, axis1=-2, axis2=-1)
    return {
        "bias_maps": np.stack([_blocks(mean, block), _blocks(std, block)]),
        "bias_distance": np.stack([_by_distance(dev), _by_distance(dev**2), _by_distance(std**2)]),
        "bias_rows": np.where(lower, mean, 0.0).sum(-1),
        "bias_cols": np.where(lower, mean, 0.0).sum(-2),
        "bias_squares": np.stack([np.where(lower, mean**2, 0.0).sum((-2, -1)), (diag**2).sum(-1)]),
        "bias_shifted": np.stack([mean.sum((-2, -1)), (mean**2).sum((-2, -1))]),
        "bias_spread": std.sum((-2, -1)),
    }


def accumulators(q: np.ndarray, k: np.ndarray, table: np.ndarray | None, scale: float, block: int,
                 positional: bool = True, cells: np.ndarray | None = None, keys: bool = False,
                 softcap: float | None = None, sinks: np.ndarray | None = None) -> dict[str, np.ndarray]:  # fmt: skip
    """Every accumulator, by name (float64), over the cells j <= i or (``cells``, (T, T) bool) one mask's for every
    sample, "a block's cells" and "the cells at d" those attended:

    - ``maps`` (4, H, nb, nb): Σ over a block's cells of w̄, σ_w, s̄, σ_s;
    - ``by_distance`` (6, H, T): Σ over the cells at d of w̄, w̄², σ_w², s̄ - f(d), (s̄ - f(d))², σ_s² (the scores
      shifted by the bias, the same along a diagonal: its spread along it is what is left, without a large f; a row
      of keys, which changes along a diagonal, is not taken off: s̄ and s̄² there);
    - ``columns`` (2, H, T): Σ_i of w̄(i, j) and of σ_w² + w̄²;
    - ``row_ws`` (N, H, T): Σ_j w_a log w_a (the entropy's negative); ``sinks`` (N, H): Σ_i w_a(i, 0);
    - ``sample_columns`` (N, H, T): Σ_i w_a(i, j);
    - ``context`` (N, H, 10): over the rows i that see at least 10 keys, Σ of w_a(i, j) over the keys of tenth
      t = floor(10 r / seen_i), r the rank of key j among the row's attended keys (j itself where causal);
    - ``sample_distance`` (2, N, H, T): Σ_i w_a(i, i - d), Σ_i s_a(i, i - d);
    - ``sample_blocks`` (2, N, H, nb, nb): Σ over a block's cells of w_a, s_a;

    with ``positional`` and N >= 2, P(i, j) = c Q(i)·K(j) / (N(N - 1)) - (s̄ - f(d)) / (N - 1) + f(d) (a bias of each
    sample's own, ``table`` (N, H, T, T): b̄ in place of f) and ref_h = P_h(0, 0):

    - ``positional_maps`` (H, nb, nb): Σ P over a block's cells;
    - ``positional_distance`` (2, H, T): Σ over the cells at d of P - f(d) and its square (of P, with ``keys``);
    - ``positional_first`` (H, T, 4): P(i, j) for j < 4 (0 where j > i);
    - ``positional_rows`` (H, T): Σ_{j<i} P(i, j); ``positional_cols`` (H, T): Σ_{i>j} P(i, j);
    - ``positional_squares`` (2, H): Σ_{j<i} P², Σ_i P(i, i)²;
    - ``positional_shifted`` (2, H): Σ_{j<=i} of P - ref and its square;

    and with N >= 3, z_a = [2 s_a - N b_a - c(q_a(i)·K(j) + Q(i)·k_a(j))] / ((N - 1)(N - 2)) (b_a: a bias of each
    sample's own; none of one bias for all, a constant of P's delete-one estimate):

    - ``jackknife_blocks`` (N, H, nb, nb): Σ over a block's cells of z_a;

    and with a bias of each sample's own, its summary over the causal cells, b̄ and σ_b its mean and spread:

    - ``bias_maps`` (2, H, nb, nb): Σ over a block's cells of b̄, σ_b;
    - ``bias_distance`` (3, H, T): Σ over the cells at d of b̄ - b̄(d, 0), its square, σ_b²;
    - ``bias_rows``, ``bias_cols`` (H, T): Σ_{j<i} b̄ by i, by j; ``bias_squares`` (2, H): Σ_{j<i} b̄², Σ_i b̄(i, i)²;
    - ``bias_shifted`` (2, H): Σ b̄, Σ b̄²; ``bias_spread`` (H,): Σ σ_b.
    """
    n, heads, t, _ = q.shape
    used, s, w, _, bias = formed(q, k, table, scale, cells, keys, softcap, sinks)
    k_heads = np.repeat(k, heads // k.shape[1], axis=1)
    w_mean, w_std, s_mean, s_std = w.mean(0), w.std(0), s.mean(0), s.std(0)
    by_sample = used.ndim == 4
    if by_sample:  # each cell's mean and spread over the samples that attend it (0 where none does)
        count = np.maximum(used.sum(0), 1)
        w_mean, s_mean = w.sum(0) / count, s.sum(0) / count
        w_std = np.sqrt(np.where(used, (w - w_mean) ** 2, 0.0).sum(0) / count)
        s_std = np.sqrt(np.where(used, (s - s_mean) ** 2, 0.0).sum(0) / count)
        i, j = np.indices((t, t))
        bias = np.where(used.any(0), _bias(table, t, keys), 0.0)
    # what the sums by distance take off: a bias the same along each diagonal (not a row of keys, not one of each cell)
    shift = 0.0 if keys or (table is not None and table.ndim >= 3) else bias
    own = bias.ndim == 4  # each sample's own bias: P's is their mean, the jackknife's each one's
    bias_a, bias = (bias, bias.mean(0)) if own else (0.0, bias)
    extra = own_bias_sums(bias_a, used, block) if own and not by_sample else {}  # (K3: causal layers, one set of cells)
    out = {
        "maps": np.stack([_blocks(x, block) for x in (w_mean, w_std, s_mean, s_std)]),
        "by_distance": np.stack(
            [_by_distance(x) for x in (w_mean, w_mean**2, w_std**2, s_mean - shift, (s_mean - shift) ** 2, s_std**2)]
        ),  # fmt: skip
        "columns": np.stack([w_mean.sum(-2), (w_std**2 + w_mean**2).sum(-2)]),
        "row_ws": np.where(w > 0, w * np.log(np.where(w > 0, w, 1.0)), 0.0).sum(-1),
        "sinks": w[..., 0].sum(-1),
        "sample_columns": w.sum(-2),
        "sample_distance": np.stack([_by_distance(w), _by_distance(s)]),
        "sample_blocks": np.stack([_blocks(w, block), _blocks(s, block)]),
        **extra,
    }
    i, j = np.indices((t, t))
    seen = used.sum(-1, keepdims=True)
    tenth = (SEGMENTS * (np.cumsum(used, -1) - 1)) // np.maximum(seen, 1)
    rows_in = (seen >= SEGMENTS) & used
    out["context"] = np.stack([np.where(rows_in & (tenth == seg), w, 0.0).sum((-2, -1)) for seg in range(SEGMENTS)],
                              -1)  # fmt: skip
    if by_sample:  # the key profile over each sample's own weights; P pairs the cells of different samples: none
        out["columns"] = np.stack([w.sum((0, -2)) / n, (w**2).sum((0, -2)) / n])
        return out
    if positional and n >= 2:
        big_q, big_k = q.sum(0), k_heads.sum(0)  # (H, T, hd)
        qk = np.einsum("hid,hjd->hij", big_q, big_k)
        p = scale * qk / (n * (n - 1)) - (s_mean - bias) / (n - 1) + bias
        p = np.where(used, p, 0.0)
        dev = np.where(used, p - shift, 0.0)
        lower = j < i
        ref = p[:, 0, 0]
        shifted = np.where(used, p - ref[:, None, None], 0.0)
        diag = np.diagonal(p, axis1=-2, axis2=-1)
        first = np.zeros((heads, t, 4))
        first[:, :, : min(4, t)] = p[:, :, : min(4, t)]
        out.update(
            {
                "positional_maps": _blocks(p, block),
                "positional_distance": np.stack([_by_distance(dev), _by_distance(dev**2)]),
                "positional_first": first,
                "positional_rows": np.where(lower, p, 0.0).sum(-1),
                "positional_cols": np.where(lower, p, 0.0).sum(-2),
                "positional_squares": np.stack([np.where(lower, p**2, 0.0).sum((-2, -1)), (diag**2).sum(-1)]),
                "positional_shifted": np.stack([shifted.sum((-2, -1)), (shifted**2).sum((-2, -1))]),
            }
        )
        if n >= 3:
            cross = (np.einsum("nhid,hjd->nhij", q, big_k) + np.einsum("hid,nhjd->nhij", big_q, k_heads)) * scale
            z = np.where(used, (2 * s - n * bias_a - cross) / ((n - 1) * (n - 2)), 0.0)
            out["jackknife_blocks"] = _blocks(z, block)
    return out
