"""The summary of a bias that depends on i - j alone, from its T values f(d): O(T + R²), no cell visited.

ALiBi, KERPLE, T5 and a FoX gate without input are b(i, j) = f(i - j). Then the profile is f with no spread,
the Toeplitz residual is 0, and every other number is a sum of f over a set of cells that prefix sums give
in O(1): with F(x) = Σ_{d<=x} f(d) and G(x) = Σ_{y<=x} F(y), the cells j <= i of query rows [a0, a1) and keys
[b0, b1) sum to G(a1-1-b0) - G(lo-1-b0) - G(a1-1-b1) + G(lo-1-b1), lo = max(a0, b0) (F, G = 0 below 0).
So ALiBi over T = 131072 is a 1024 x 1024 map in about a second, exact to float64 rounding.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from biasviz.store.format import DIAGNOSTIC_FIELDS
from biasviz.summaries.layer import Summary
from biasviz.summaries.maps import block_sums
from biasviz.summaries.measures import _ratio


def toeplitz_summary(f: torch.Tensor, seq_len: int, block: int, samples: int) -> Summary:
    """The docs/hdf5.md, 'Summary files' summary of b(i, j) = f[h, i - j] (``f`` (H, T)) for a run over ``samples``
    samples."""
    sums, count = block_sums(f, seq_len, block)
    mean = torch.where(count > 0, sums / count, float("nan"))
    std = torch.where(count > 0, 0.0, float("nan")).expand_as(mean)
    profile = torch.stack([f.double(), torch.zeros_like(f, dtype=torch.float64)]).float()
    return Summary(mean=mean.float().cpu().numpy(), std=std.float().cpu().numpy(), profile=profile.cpu().numpy(),
                   diagnostics=toeplitz_diagnostics(f, samples))  # fmt: skip


def toeplitz_diagnostics(f: torch.Tensor, samples: int) -> np.ndarray:
    """Context dependence (0, or NaN with < 2 samples), Toeplitz residual (0), separability residual, per head."""
    x = f.double().cpu().numpy()  # (H, T)
    t = x.shape[-1]
    n_d = np.arange(t, 0, -1, dtype=np.float64)  # cells on diagonal d: T - d
    cells = t * (t + 1) / 2
    dev = x - x[:, :1]
    s1, s2 = (n_d * dev).sum(-1), (n_d * dev * dev).sum(-1)
    spread = np.sqrt(np.maximum(s2 / cells - (s1 / cells) ** 2, 0.0))
    prefix = np.cumsum(x, axis=-1) - x[:, :1]  # Σ_{d=1..k} f(d)
    g = prefix - prefix[:, ::-1]  # row sums Σ_{j<i} minus column sums Σ_{i>j}: F(i) - F(T - 1 - i)
    off = (n_d[1:] * x[:, 1:] ** 2).sum(-1)
    rss = off - (g * g).sum(-1) / t + t * x[:, 0] ** 2
    out = np.zeros(len(x), dtype=[(name, np.float64) for name in DIAGNOSTIC_FIELDS])
    for h in range(len(x)):
        dependence = _ratio(0.0, spread[h]) if samples >= 2 else math.nan
        out[h] = (dependence, _ratio(0.0, spread[h]), _ratio(math.sqrt(max(rss[h], 0.0) / cells), spread[h]))
    return out


def distance_values(scheme: torch.nn.Module | None, seq_len: int) -> torch.Tensor | None:
    """f(d) for d = 0 .. T-1 as (H, T), where the scheme's bias is a function of i - j alone; else None.

    The values come from the scheme's own ``distance_bias``, through which its ``bias`` fills the (T, T)
    matrix, so they are the very numbers (same operations, same precision) of every cell.
    """
    if scheme is None or getattr(scheme, "depends_on_input", True) or not hasattr(scheme, "distance_bias"):
        return None
    tensors = [*scheme.parameters(), *scheme.buffers()]
    device = tensors[0].device if tensors else torch.device("cpu")
    with torch.no_grad():
        f = scheme.distance_bias(torch.arange(seq_len, device=device))  # (H, T)
    return None if f is None else f.detach()
