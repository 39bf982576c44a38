"""What the fused kernels' sums finish into beside the weights' and scores' maps (:mod:`biasviz.summaries.fused_layer`):
the positional logits' maps, profile and diagnostics, and the summary of a bias of each sample's own (K3's sums), as
the torch path's :class:`~biasviz.summaries.layer.QuantitySummary` finishes its own."""

from __future__ import annotations

from typing import Any

import torch

from biasviz.common.shapes import host_arrays
from biasviz.store.format import non_finite_error
from biasviz.summaries import Summary
from biasviz.summaries.attended import Attended
from biasviz.summaries.kernels.biases import SampleEnds
from biasviz.summaries.layer import MASKED_SEPARABILITY_LEN
from biasviz.summaries.maps import geometry_counts
from biasviz.summaries.measures import BiasMeasureSums
from biasviz.summaries.position import from_key_profile


def ends_summary(acc: dict[str, torch.Tensor], ends: SampleEnds, *, samples: int, seq_len: int,
                  block: int) -> Summary:  # fmt: skip
    """The summary of a bias of each sample's own (causal, no mask of its own), as the torch path's
    :meth:`~biasviz.summaries.layer.QuantitySummary.result` finishes it, from K3's sums
    (:func:`~biasviz.summaries.kernels.ends_sums`): its maps, its profile by distance (each diagonal's sums less its
    first cell b̄(d, 0) = ē(d) - ē(0), formed as K3 formed it) and its diagnostics."""
    device = acc["bias_maps"].device
    heads = acc["bias_maps"].shape[1]
    counts = geometry_counts(seq_len, block, True, device)
    maps = torch.where(counts > 0, acc["bias_maps"] / counts, float("nan")).float()
    per_d = torch.arange(seq_len, 0, -1, dtype=torch.float64, device=device)
    dev, dev_sq, within = acc["bias_distance"]
    mean_ends = ends.mean().to(device)  # ē, float32 as K3 reads it
    first = (mean_ends - mean_ends[:, :1]).double()
    between = (dev_sq / per_d - (dev / per_d) ** 2).clamp(min=0.0)
    profile = torch.stack([first + dev / per_d, (within / per_d + between).sqrt()]).float()
    sums = _measure_sums(acc, "bias", torch.zeros(heads, dtype=torch.float64, device=device),  # b̄(0, 0) = 0
                         seq_len * (seq_len + 1) // 2)  # fmt: skip
    sums.spread_sum = acc["bias_spread"]
    diagnostics = sums.results(samples, (dev_sq - dev * dev / per_d).clamp(min=0.0).sum(-1))
    mean, std, by_distance = host_arrays(maps[0], maps[1], profile)
    return Summary(mean=mean, std=std, profile=by_distance, diagnostics=diagnostics)


def positional_results(acc: dict[str, torch.Tensor], table: torch.Tensor | None, layer: int, seq_len: int,
                counts: torch.Tensor, attended: Attended | None) -> tuple[torch.Tensor, torch.Tensor, Any]:  # fmt: skip
    """P's block means, its profile over all keys and over keys j >= 4, and its diagnostics, from the kernels' sums
    (its sums by distance shifted by f(d), which makes a diagonal of equal cells exactly Toeplitz), over the cells of
    ``attended`` where the call has a mask of its own."""
    device = counts.device
    heads = acc["positional_maps"].shape[0]
    per_d = torch.arange(seq_len, 0, -1, dtype=torch.float64, device=device)
    if attended is not None:
        per_d = attended.per_distance.to(device)
    f = torch.zeros(heads, seq_len, dtype=torch.float64, device=device) if table is None else table.to(device).double()
    p_map = torch.where(counts > 0, acc["positional_maps"] / counts, float("nan")).float()
    if not bool(torch.isfinite(acc["positional_maps"]).all()):
        raise non_finite_error("positional", layer)
    dev, dev_sq = acc["positional_distance"]
    by_distance = f + dev / per_d
    cells = seq_len * (seq_len + 1) // 2 if attended is None else attended.mask.sum((1, 2)).double().cpu().numpy()
    sums = _measure_sums(acc, "positional", acc["positional_first"][:, 0, 0].double(), cells)
    toeplitz = (dev_sq - dev * dev / per_d.clamp(min=1)).clamp(min=0.0).sum(-1)
    fit = None if attended is None else attended.laplacian() if seq_len <= MASKED_SEPARABILITY_LEN else False
    diagnostics = sums.results(0, toeplitz, fit)
    return p_map, from_key_profile(by_distance, acc["positional_first"], attended), diagnostics


def _measure_sums(acc: dict[str, torch.Tensor], kind: str, ref: torch.Tensor, cells: Any) -> BiasMeasureSums:
    """The diagnostics' running sums of ``kind`` ("positional", "bias") as the kernels left them (their
    ``<kind>_rows``, ``_cols``, ``_squares`` and ``_shifted``, the Triton ``measure_sums`` of each tile), shifted by
    ``ref`` (H,) over ``cells`` (a number, or one a head)."""
    heads, seq_len = acc[f"{kind}_rows"].shape
    sums = BiasMeasureSums(heads, seq_len, acc[f"{kind}_rows"].device)
    sums.ref, sums.cells = ref, cells
    sums.row_sum, sums.col_sum = acc[f"{kind}_rows"], acc[f"{kind}_cols"]
    sums.shifted, sums.squares = acc[f"{kind}_shifted"].T.contiguous(), acc[f"{kind}_squares"].T.contiguous()
    return sums
