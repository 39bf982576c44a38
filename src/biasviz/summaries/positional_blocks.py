"""The standard error of P's block map (docs/position-measures.md): the delete-one jackknife over samples, block by
block.

With sample a left out (Q, K the sums of q and k over all N samples, G = Σ_a q_a·k_a, c the call's scale):

    P_(−a) = [c(Q·K − G) − c(q_a·K + Q·k_a) + 2(s_a − b_a)] / ((N − 1)(N − 2)) + (N b̄ − b_a) / (N − 1)

since Σ over pairs b ≠ d of the others is Q·K − G less a's row and column, and c q_a·k_a = s_a − b_a. What varies
with a is z_a = [2 s_a − N b_a − c(q_a·K + Q·k_a)] / ((N − 1)(N − 2)), linear in the cells, so each sample's block
mean of z_a is folded over samples as any other (:class:`~biasviz.summaries.sample_blocks.SampleBlocks`), and the
jackknife SE is √((N − 1)/N · Σ_a (z̄_a − mean z̄)²). A bias the same in every sample is a constant: left out.

q_a·K + Q·k_a summed over a block's cells j <= i needs no (rows x keys) product: below the diagonal it is
(Σ_i q_a(i))·(Σ_j K(j)) + (Σ_i Q(i))·(Σ_j k_a(j)) over the block's rows and keys, and on the diagonal
Σ_i q_a(i)·K_c(i) + Q(i)·k_a,c(i) with K_c the sums of K over the block's keys up to i. A call with a mask of its
own forms the cells (one product per sample and block of rows) and sums those it attends.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from biasviz.summaries.attended import Attended
from biasviz.summaries.maps import _group_sums
from biasviz.summaries.sample_blocks import Pooled, SampleBlocks

KEY_BLOCKS_BYTES = 1 << 26  # every sample's key-block sums kept up to this size (PositionalJackknife._key_blocks)
Operands = Callable[[int, int, int, int], tuple[torch.Tensor, torch.Tensor]]  # (a, r0, r1, k0) -> q_a rows, k_a keys


def _within_blocks(x: torch.Tensor, start: int, block: int) -> torch.Tensor:
    """(H, n, d) positions ``start ..`` (``start`` a block's first) -> the sums over each block up to each position.

    >>> _within_blocks(torch.ones(1, 5, 1), 0, 2)[0, :, 0].tolist()
    [1.0, 2.0, 1.0, 2.0, 1.0]
    """
    h, n, d = x.shape
    pad = -n % block
    padded = torch.nn.functional.pad(x, (0, 0, 0, pad)).view(h, (n + pad) // block, block, d)
    return padded.cumsum(2).view(h, n + pad, d)[:, :n]


class JackknifeBlocks(SampleBlocks):
    """Each sample's block means of z_a (see the module), folded over samples: ``positional_mean_se``, from sums made
    elsewhere (the fused kernels, :meth:`SampleBlocks.add_block_sums`)."""

    samples = 0

    def standard_error(self) -> np.ndarray | None:
        """(H, nb, nb) float32: the delete-one jackknife SE of P's block means; None below 3 samples."""
        se = super().standard_error()  # √(m2 / (N (N - 1)))
        return None if se is None else (se * (self.samples - 1)).astype(np.float32)


class PositionalJackknife(JackknifeBlocks):
    """Each sample's block means of z_a (see the module), folded over samples as they are formed."""

    def __init__(self, q_sum: torch.Tensor, k_sum: torch.Tensor, operands: Operands, *, scale: float,
                 samples: int, seq_len: int, block: int, device: torch.device,
                 attended: Attended | None = None) -> None:  # fmt: skip
        """``q_sum``, ``k_sum``: (T, H, d) float64 over every sample, as P's; ``operands(a, r0, r1, k0)``: sample a's
        q at rows r0 .. r1 - 1 and k at keys k0 .. r1 - 1, (rows or r1 - k0, H·d), as the call received them."""
        heads = q_sum.shape[1]
        super().__init__(heads=heads, seq_len=seq_len, block=block, causal=True, device=device, attended=attended)
        self.begin(0, samples)
        n = samples
        denom = (n - 1) * (n - 2)
        self.weights = {"scores": 2.0 / denom, "bias": -n / denom, "operands": -scale / denom}
        self.samples, self.operands = n, operands
        # float32, as P's own product Q·K (summary.position): each term's rounding stays at one score's resolution
        self.q = q_sum.to(device=device, dtype=torch.float32).transpose(0, 1).contiguous()  # (H, T, d)
        self.k = k_sum.to(device=device, dtype=torch.float32).transpose(0, 1).contiguous()
        if attended is None:
            self.k_blocks = _group_sums(self.k, -2, 0, block)  # (H, nb, d)
            self.k_within = _within_blocks(self.k, 0, block)  # (H, T, d)
        # each sample's sums of k over whole key blocks, filled as its rows come: summed again for every block of rows
        # they cost half of this accumulator's time (16 rows of 4096 keys, GPT-2-small shape: 0.5 of 1.0 ms a call).
        # (N, H, nb, d) float32, kept up to KEY_BLOCKS_BYTES (3 MiB a sample at R = 1024 with 12 heads of 64): past
        # that, summed again each time, so that memory stops growing with N
        self.ka_blocks = torch.zeros(0)
        self.keep_key_blocks = samples * heads * self.n_blocks * q_sum.shape[-1] * 4 <= KEY_BLOCKS_BYTES
        self.ka_done = [0] * samples  # whole key blocks summed so far, per sample

    def add_sample(self, a: int, r0: int, scores: torch.Tensor, bias: torch.Tensor | None,
                   pooled: dict[str, Pooled] | None = None,
                   more: tuple[tuple[Pooled, float], ...] = ()) -> None:  # fmt: skip
        """Sample a's rows r0 .. of scores (1, H, rows, r1) and of a bias that differs by sample (None: none, or the
        same for every sample); ``pooled``: their block sums where another accumulator formed them already; ``more``:
        further block sums of the sample's rows, each with its weight in z_a."""
        pooled = pooled or {}
        rows, r1 = scores.shape[-2:]
        terms = [(pooled.get(kind) or self.pool(r0, values), self.weights[kind])
                 for kind, values in (("scores", scores), ("bias", bias)) if values is not None]  # fmt: skip
        self.add_sums(a, r0, rows, [*terms, *more, (self._operand_sums(a, r0, r1), self.weights["operands"])])

    def _operand_sums(self, a: int, r0: int, r1: int) -> Pooled:
        """Σ over each block's attended cells of q_a(i)·K(j) + Q(i)·k_a(j), rows r0 .. r1 - 1."""
        h, b = self.heads, self.block
        q0, last = r0 // b, (r1 - 1) // b  # the rows' first and last query blocks
        # the keys read: every one under a mask of the call's own; else the rows' own key blocks and the whole key
        # blocks not yet summed for this sample (a bank spilled to its file reads no more than those)
        k0 = 0 if self.attended is not None or not self.keep_key_blocks else min(self.ka_done[a], q0) * b
        q_rows, k_keys = self.operands(a, r0, r1, k0)
        qa = q_rows.to(self.device, torch.float32).view(r1 - r0, h, -1).transpose(0, 1)  # (H, rows, d): a few rows
        q_all = self.q[:, r0:r1]
        if self.attended is not None:
            ka = k_keys.to(self.device, torch.float32).view(r1, h, -1).transpose(0, 1)  # (H, r1, d)
            cells = qa @ self.k[:, :r1].transpose(1, 2) + q_all @ ka.transpose(1, 2)  # (H, rows, r1)
            return self.pool(r0, cells[None])
        keys = k_keys.to(self.device, torch.float32).view(r1 - k0, h, -1)  # positions first, as stored: summed
        ka_blocks = self._key_blocks(a, keys, k0, last)  # (H, last, d)
        qa_g, q_g = _group_sums(qa, -2, r0, b), _group_sums(q_all, -2, r0, b)  # (H, nq, d)
        below = qa_g @ self.k_blocks[:, :last].transpose(1, 2) + q_g @ ka_blocks.transpose(1, 2)  # (H, nq, last)
        out = torch.zeros(h, qa_g.shape[1], last + 1, dtype=torch.float32, device=self.device)
        out[..., :last] = below
        qb = torch.arange(q0, last + 1, device=self.device)[:, None]
        out[..., :last].masked_fill_(torch.arange(last, device=self.device)[None, :] >= qb, 0.0)  # keys after
        own = keys[q0 * b - k0 :].transpose(0, 1)  # (H, positions, d): the rows' own key blocks
        ka_within = _within_blocks(own, 0, b)[:, r0 - q0 * b :]  # (H, rows, d)
        diagonal = (qa * self.k_within[:, r0:r1]).sum(-1) + (q_all * ka_within).sum(-1)  # (H, rows)
        on = _group_sums(diagonal, -1, r0, b)  # (H, nq)
        out[:, torch.arange(len(qb)), qb[:, 0]] = on
        return [(0, out[None])]

    def _key_blocks(self, a: int, keys: torch.Tensor, k0: int, last: int) -> torch.Tensor:
        """Sample a's sums of k (H, last, d) over key blocks 0 .. last - 1; ``keys`` (positions k0 .., H, d) from
        the first key block not yet summed (from 0 where none are kept)."""
        if not self.keep_key_blocks:
            return _group_sums(keys[: last * self.block], -3, 0, self.block).transpose(0, 1)
        if not self.ka_blocks.numel():
            self.ka_blocks = torch.zeros(self.samples, self.heads, self.n_blocks, keys.shape[-1], device=self.device)
        done, b = self.ka_done[a], self.block
        if last > done:
            self.ka_blocks[a, :, done:last] = _group_sums(keys[done * b - k0 : last * b - k0], -3, 0, b).transpose(0, 1)
            self.ka_done[a] = last
        return self.ka_blocks[a, :, :last]
