"""The SE of P's distance profile for calls streamed as the model runs (docs/position-measures.md): BLOOM, MPT, Falcon
with ALiBi, T5's decoder, GPT-2, eager attention.

The delete-one P of such a call needs every sample's q and k against the sums over all samples, which are known only
once the last sample has passed: each sample's q and c·k are kept as they come (N·T·H·d numbers, in a
:class:`~biasviz.summaries.bank.SampleBank` that spills to a temporary file past its budget, nothing of size N·T²),
and the additive part, by distance, as each sample's sums over all cells and over the first keys. At the end the
jackknife is formed as for a replayed call (:func:`~biasviz.summaries.positional_frequency.positional_frequency`,
a head's dims as one group), with the others' mean bias (N b̄ − b_a) / (N − 1) added to each delete-one P.
"""

from __future__ import annotations

import numpy as np
import torch

from biasviz.adapters.rotary import RotaryLayout
from biasviz.summaries.attended import Attended
from biasviz.summaries.bank import SampleBank
from biasviz.summaries.positional_frequency import FIRST_KEYS, positional_frequency

LAYER = 0  # the bank holds one layer


class BiasByDistance:
    """Each sample's sums of an additive part by distance d = i - j over its causal cells (N, H, T), and the same over
    the cells of the first keys j < 4: what its delete-one P needs of it (the others' mean bias)."""

    def __init__(self, *, samples: int, heads: int, seq_len: int, device: torch.device) -> None:
        self.samples, self.heads, self.seq_len, self.device = samples, heads, seq_len, device
        self.every: torch.Tensor | None = None  # (N, H, T): Σ over each distance's cells of each sample's bias
        self.first: torch.Tensor | None = None  # the same over the cells of keys j < 4

    def add(self, first: int, row0: int, block: torch.Tensor) -> None:
        """Samples ``first ..``'s bias rows ``row0 ..`` (B, H, rows, K), NaN (or -inf) where masked."""
        if self.every is None:
            self.every = torch.zeros(self.samples, self.heads, self.seq_len, dtype=torch.float64, device=self.device)
            self.first = torch.zeros_like(self.every)
        assert self.first is not None
        b, h, rows, keys = block.shape
        i = torch.arange(row0, row0 + rows, device=block.device)[:, None]
        j = torch.arange(keys, device=block.device)[None, :]
        d = i - j
        values = block.double()
        values = torch.where(torch.isfinite(values) & (d >= 0), values, 0.0)
        index = d.clamp(min=0).flatten().expand(b, h, -1)
        at = slice(first, first + b)
        self.every[at] += torch.zeros(b, h, self.seq_len, dtype=torch.float64, device=block.device).scatter_add_(
            -1, index, values.flatten(2)).to(self.device)  # fmt: skip
        early = values[..., : min(FIRST_KEYS, keys)]
        index = d[:, : early.shape[-1]].clamp(min=0).flatten().expand(b, h, -1)
        self.first[at] += torch.zeros(b, h, self.seq_len, dtype=torch.float64, device=block.device).scatter_add_(
            -1, index, early.flatten(2)).to(self.device)  # fmt: skip

    def sums(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(over all cells, over the first keys' cells), or None where no bias came."""
        return None if self.every is None or self.first is None else (self.every, self.first)


class StreamedJackknife:
    """One causal layer's per-sample q, c·k and bias sums by distance, for ``positional_profile_se``."""

    def __init__(self, *, samples: int, heads: int, seq_len: int, device: torch.device) -> None:
        self.samples, self.heads, self.seq_len, self.device = samples, heads, seq_len, device
        self.bank = SampleBank(samples, device=device)
        self.bias = BiasByDistance(samples=samples, heads=heads, seq_len=seq_len, device=device)

    def operands(self, first: int, q: torch.Tensor, k: torch.Tensor) -> None:
        """Samples ``first ..``'s q and c·k (B, H, T, hd), as the call received them."""
        self.bank.start = first
        self.bank.put(LAYER, "q", q.transpose(1, 2).flatten(2).float())
        self.bank.put(LAYER, "k", k.transpose(1, 2).flatten(2).float())

    def add_bias(self, first: int, row0: int, block: torch.Tensor) -> None:
        """Samples ``first ..``'s bias rows ``row0 ..`` (B, H, rows, K), NaN where masked."""
        self.bias.add(first, row0, block)

    def standard_error(self, attended: Attended | None) -> np.ndarray | None:
        """(2, H, T) float32: the jackknife SE of P's profile over all keys and over keys j >= 4; None where it cannot
        be formed (a mask that is no rule of distance, no q and k)."""
        if not self.bank.holds(LAYER, "q"):
            return None
        try:
            got = positional_frequency(RotaryLayout(interleaved=False, rotary_dims=0), self.bank, LAYER,
                                       heads=self.heads, scale=1.0, causal=True, attended=attended,
                                       bias=self.bias.sums())  # fmt: skip
        finally:
            self.bank.close()
        return got.get("positional_profile_se")
