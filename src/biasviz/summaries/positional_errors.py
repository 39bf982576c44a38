"""The SE of P's distance profile for calls streamed as the model runs (docs/position-measures.md): BLOOM, MPT, Falcon
with ALiBi, T5's decoder, GPT-2, eager attention.

The delete-one P of such a call needs every sample's q and k against the sums over all samples, which are known only
once the last sample has passed: each sample's q and c·k are kept as they come (N·T·H·d numbers, in a
:class:`~biasviz.summaries.bank.SampleBank` that spills to a temporary file past its budget, nothing of size N·T²),
and the additive part, by distance, as each sample's sums over all cells and over the first keys. At the end the
jackknife is formed as for a replayed call (:func:`~biasviz.summaries.positional_frequency.positional_frequency`,
a head's dims as one group), with the others' mean bias (N b̄ − b_a) / (N − 1) added to each delete-one P.

P's block map's SE (:class:`~biasviz.summaries.positional_blocks.PositionalJackknife`) forms each sample's rows
c·q_a·k_a again from the same q and c·k at the end; the additive part enters it by each sample's sums over each
block's attended cells (N·H·nb² numbers, kept up to ``BIAS_BLOCKS_BYTES``; past that, and only where the bias differs
by sample, the map has no SE and the layer's note says why).
"""

from __future__ import annotations

import numpy as np
import torch

from biasviz.adapters.rotary import RotaryLayout
from biasviz.store.datasets import POSITIONAL_MEAN, POSITIONAL_PROFILE, se_name
from biasviz.summaries.attended import Attended
from biasviz.summaries.bank import SampleBank
from biasviz.summaries.positional_blocks import PositionalJackknife
from biasviz.summaries.positional_frequency import FIRST_KEYS, positional_frequency
from biasviz.summaries.sample_blocks import SampleBlocks

LAYER = 0  # the bank holds one layer
ROWS = 256  # query rows of every sample formed again at a time for P's block map
BIAS_BLOCKS_BYTES = 1 << 26  # each sample's bias sums by block kept up to this size (float64)


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
    """One causal layer's per-sample q, c·k and bias sums by distance, for ``positional_profile_se`` and
    ``positional_mean_se``."""

    def __init__(self, *, samples: int, heads: int, seq_len: int, device: torch.device, block: int = 1) -> None:
        self.samples, self.heads, self.seq_len, self.device = samples, heads, seq_len, device
        self.bank = SampleBank(samples, device=device)
        self.bias = BiasByDistance(samples=samples, heads=heads, seq_len=seq_len, device=device)
        self.block, nb = block, -(-seq_len // block)
        self.keeps_blocks = samples * heads * nb * nb * 8 <= BIAS_BLOCKS_BYTES
        self.bias_blocks: torch.Tensor | None = None  # (N, H, nb, nb) float64: each sample's bias sums by block
        self._pooler: SampleBlocks | None = None  # sums a block of rows over each block's attended cells
        # each sample's bias weighted by a fixed pseudo-random number per cell, summed: equal in every sample where
        # the bias is (P's block map needs each sample's bias per cell where it differs: it is not kept)
        self.print = torch.zeros(samples, 2, dtype=torch.float64, device=device)

    def operands(self, first: int, q: torch.Tensor, k: torch.Tensor) -> None:
        """Samples ``first ..``'s q and c·k (B, H, T, hd), as the call received them."""
        self.bank.start = first
        self.bank.put(LAYER, "q", q.transpose(1, 2).flatten(2).float())
        self.bank.put(LAYER, "k", k.transpose(1, 2).flatten(2).float())

    def add_bias(self, first: int, row0: int, block: torch.Tensor, attended: Attended | None = None) -> None:
        """Samples ``first ..``'s bias rows ``row0 ..`` (B, H, rows, K), NaN where masked; ``attended``: the call's
        own mask, where it has one."""
        self.bias.add(first, row0, block)
        if self.keeps_blocks:
            if self._pooler is None:
                self._pooler = SampleBlocks(heads=self.heads, seq_len=self.seq_len, block=self.block, causal=True,
                                            device=self.device, attended=attended)  # fmt: skip
                nb = self._pooler.n_blocks
                self.bias_blocks = torch.zeros(self.samples, self.heads, nb, nb, dtype=torch.float64,
                                               device=self.device)  # fmt: skip
            assert self.bias_blocks is not None
            q0, at = row0 // self.block, slice(first, first + len(block))
            for k0, sums in self._pooler.pool(row0, block):
                nq, n = sums.shape[2:]
                self.bias_blocks[at, :, q0 : q0 + nq, k0 : k0 + n] += sums.to(self.device, torch.float64)
        rows, keys = block.shape[-2:]
        i = torch.arange(row0, row0 + rows, dtype=torch.float64, device=block.device)[:, None]
        j = torch.arange(keys, dtype=torch.float64, device=block.device)[None, :]
        weight = torch.frac(torch.sin(i * 12.9898 + j * 78.233) * 43758.5453)  # (rows, K) in [0, 1)
        values = block.double()
        finite = torch.isfinite(values)
        weighted = torch.where(finite, values, 0.0) * weight
        prints = torch.stack([weighted.flatten(1).sum(-1), (finite * weight).flatten(1).sum(-1)], dim=-1)
        self.print[first : first + len(block)] += prints.to(self.device)

    @property
    def bias_differs(self) -> bool:
        """Whether the bias differed by sample (beyond float64 rounding of the same values)."""
        size = self.print.abs().max().item()
        return bool((self.print - self.print[:1]).abs().max().item() > 1e-9 * max(size, 1.0))

    @property
    def mean_left_out(self) -> bool:
        """Whether P's block map has no SE: a bias that differs by sample, its sums by block not kept."""
        return self.bias_blocks is None and self.bias_differs

    def standard_errors(self, attended: Attended | None, block: int) -> dict[str, np.ndarray]:
        """``positional_profile_se`` (2, H, T): the jackknife SE of P's profile over all keys and over keys j >= 4,
        and ``positional_mean_se`` (H, nb, nb) of P's block means, where the bias (if any) is the same in every
        sample; those that cannot be formed (a mask that is no rule of distance, no q and k) left out."""
        if not self.bank.holds(LAYER, "q"):
            self.bank.close()
            return {}
        try:
            got = positional_frequency(RotaryLayout(interleaved=False, rotary_dims=0), self.bank, LAYER,
                                       heads=self.heads, scale=1.0, causal=True, attended=attended,
                                       bias=self.bias.sums())  # fmt: skip
            out = {name: x for name, x in got.items() if name == se_name(POSITIONAL_PROFILE)}
            if not self.mean_left_out:
                out[se_name(POSITIONAL_MEAN)] = self._mean_error(attended, block)
        finally:
            self.bank.close()
        return out

    def _mean_error(self, attended: Attended | None, block: int) -> np.ndarray:
        """P's block map's jackknife (:class:`~biasviz.summaries.positional_blocks.PositionalJackknife`), each
        sample's rows c·q_a·k_a formed again from its q and c·k, and its bias by its block sums: s_a = c·q_a·k_a + b_a,
        so b_a enters z_a with the weights of the scores and of the bias together. A bias the same in every sample is
        a constant of every delete-one P and leaves the SE as it is (where its sums by block were not kept)."""
        n, heads, t = self.samples, self.heads, self.seq_len
        sums = [self.bank.sample_sum(LAYER, name, heads) for name in ("q", "k")]
        jackknife = PositionalJackknife(*sums, self.bank.operands(LAYER), scale=1.0, samples=n, seq_len=t,
                                        block=block, device=self.device, attended=attended)  # fmt: skip
        weight = jackknife.weights["scores"] + jackknife.weights["bias"]
        step = block * max(1, ROWS // block)  # whole query blocks at a time: each sample's bias sums go in whole
        for r0 in range(0, t, step):
            r1 = min(t, r0 + step)
            for a in range(n):
                q = self.bank.get(LAYER, "q", a, r0, r1).view(r1 - r0, heads, -1).transpose(0, 1).double()
                k = self.bank.get(LAYER, "k", a, 0, r1).view(r1, heads, -1).transpose(0, 1).double()
                more = ()
                if self.bias_blocks is not None:
                    more = (([(0, self.bias_blocks[a : a + 1, :, r0 // block : -(-r1 // block)])], weight),)
                jackknife.add_sample(a, r0, (q @ k.transpose(1, 2)).float()[None], None, more=more)  # (1, H, rows, r1)
            jackknife.finish(r1)
        se = jackknife.standard_error()
        assert se is not None
        return se
