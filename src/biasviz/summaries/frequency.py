"""docs/position-measures.md's ``frequency_use``: which rotary frequencies a head uses (Barbero et al., ICLR 2025,
"Round and round we go"): per head, the mean 2-norm of each rotary pair of q and of k over samples and positions.

A rotation keeps each pair's norm, so the norms of q and k as they reach the attention call (rotated) are those of
the model's q and k before it. Pairs follow the model's own layout: half-split (Llama, GPT-NeoX: dims f and
f + d_rot/2) or interleaved (GPT-J: 2f and 2f + 1); f = 0 turns fastest. Dims past d_rot (partial rotary) are one
last row, the norm of all of them together.
"""

from __future__ import annotations

from typing import Any

import torch

from biasviz.adapters.again import SAMPLE_CELLS
from biasviz.adapters.rotary import RotaryLayout
from biasviz.store.datasets import FREQUENCY_USE, se_name
from biasviz.summaries.sample_cells import ROWS_PER_READ
from biasviz.summaries.sample_profiles import sample_stats


class FrequencyUse:
    """Per sample, the mean over positions of each rotary pair's norm of q and of k: (N, 2, H, pairs [+ 1])."""

    def __init__(self, layout: RotaryLayout, samples: int) -> None:
        self.layout, self.samples = layout, samples
        self.per_sample: torch.Tensor | None = None

    def add(self, first: int, q: torch.Tensor, k: torch.Tensor, cells: torch.Tensor | None = None,
            positions: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:  # fmt: skip
        """Samples ``first ..``: q and k (B, H, T, hd) as the call received them (for grouped heads, the key of each
        query head's group); ``cells``: the attended cells (B or 1, 1 or H, T, T) where the call has a mask of its own,
        so that only the queries that see some key and the keys some query sees count (padding does not), or
        ``positions``: those queries and keys themselves (B or 1, 1 or H, T) each."""
        rows = keys = None
        if cells is not None:
            cells = cells.to(q.device)
            rows, keys = cells.any(-1), cells.any(-2)  # (B or 1, 1 or H, T)
        elif positions is not None:
            rows, keys = (x.to(q.device) for x in positions)
        norms = torch.stack([self._norms(q, rows), self._norms(k, keys)], dim=1)  # (B, 2, H, pairs [+ 1])
        if self.per_sample is None:
            self.per_sample = torch.zeros(self.samples, *norms.shape[1:], dtype=torch.float64, device=norms.device)
        self.per_sample[first : first + len(norms)] = norms

    def _norms(self, x: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """Each pair's norm at every position in float32 (a norm rounds to 1e-7 of itself), averaged in float64 over
        the positions ``at`` (B or 1, 1 or H, T) (all where None; NaN with none): a float64 copy of q and k cost as
        much as the rest of the measure."""
        x = x.float()
        a, b = self.layout.pair_dims()
        pairs = torch.sqrt(x[..., a].square() + x[..., b].square())  # (B, H, T, pairs)
        rest = x[..., self.layout.rotary_dims :]
        if rest.shape[-1]:
            pairs = torch.cat([pairs, rest.square().sum(-1, keepdim=True).sqrt()], dim=-1)
        if at is None:
            return pairs.mean(-2, dtype=torch.float64)
        total = torch.where(at[..., None], pairs, 0.0).sum(-2, dtype=torch.float64)
        count = at.sum(-1, dtype=torch.float64)[..., None]
        return torch.where(count > 0, total / count.clamp(min=1), float("nan")).expand(len(x), -1, -1)

    def result(self) -> dict[str, Any]:
        """``frequency_use`` (2: q, k; H; pairs [+ unrotated]), with 3 samples or more its SE, and the attributes
        that say which rows are rotary pairs (:data:`biasviz.store.datasets.ROW_ATTRS`)."""
        assert self.per_sample is not None, "no q and k arrived"
        stats, se = sample_stats(self.per_sample)
        out: dict[str, Any] = {FREQUENCY_USE: stats[0].float().cpu().numpy(),
                               "rotary_pairs": self.layout.rotary_dims // 2, "rotary_layout": self.layout.name}
        if se is not None:
            out[se_name(FREQUENCY_USE)] = se.float().cpu().numpy()
        return out


def frequency_from_bank(bank: Any, layer: int, heads: int, use: FrequencyUse, mask: torch.Tensor | None = None,
                        own: bool = False) -> None:  # fmt: skip
    """Feed ``use`` every sample's q and k kept in a :class:`~biasviz.summaries.bank.SampleBank`; ``mask``: the call's
    one mask of its own (1 or H, T, T); ``own``: each sample's cells, kept in the bank (samples masked differently)."""
    for a in range(bank.samples):
        q, k = (bank.get(layer, name, a, 0, bank.seq_len(layer, name)) for name in ("q", "k"))
        t = q.shape[0]
        cells = None if mask is None else mask[None]
        positions = None
        if own:  # the sample's queries that see some key and keys some query sees, its mask read a few rows at a time
            heads_own = bank.cell_heads(layer, SAMPLE_CELLS)  # 1, or H where heads attend cells of their own
            rows = torch.zeros(heads_own, t, dtype=torch.bool)
            keys = torch.zeros(heads_own, t, dtype=torch.bool)
            for r0 in range(0, t, ROWS_PER_READ):
                part = bank.get_cells(layer, SAMPLE_CELLS, a, r0, min(t, r0 + ROWS_PER_READ), t).cpu()
                rows[:, r0 : r0 + part.shape[1]] = part.any(-1)
                keys |= part.any(1)
            positions = (rows[None], keys[None])
        use.add(a, *(x.view(1, x.shape[0], heads, -1).transpose(1, 2) for x in (q, k)), cells, positions)
