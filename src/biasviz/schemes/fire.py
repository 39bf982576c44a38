"""FIRE: an MLP of the progressively interpolated distance (Li et al., ICLR 2024)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from biasviz.common.shapes import gpu_shaped
from biasviz.schemes import register
from biasviz.schemes.base import (
    PositionScheme,
    RowsFn,
    option_int,
    option_number,
    query_positions,
    relative_distance,
    toeplitz_rows,
)

MIN_C = 1e-4  # psi(x) = log(c x + 1) needs c > 0
MIN_THRESHOLD = 1.0  # psi(max(L, i)) must stay > 0 at i = 0
MLP_CELLS = 1 << 14  # cells per MLP call in :meth:`FIRE.rows`: the (cells, hidden) activations stay in cache
# ... on a GPU, at least this many: a few launches a block of rows (its activations 256 MiB at 32 hidden units), not
# one a 2^14 cells (T = 32768: 33,000 pieces a sample and layer, each a launch or three)
GPU_MLP_CELLS = 1 << 21
MIN_MLP_CELLS = 64  # fewer rows take another matmul kernel, which rounds differently from the full bias's


@register
class FIRE(PositionScheme):
    """b_h(i, j) = f_theta(psi(d) / psi(max(L, i)))_h with psi(x) = log(c x + 1).

    The input of the MLP lies in [0, 1] whatever the length, which is what lets FIRE extrapolate.
    """

    name = "fire"

    def __init__(self, n_head: int, d_model: int, **options: Any) -> None:
        super().__init__(n_head, d_model, **options)
        hidden = int(self.options["hidden"])
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, n_head))
        self.c = nn.Parameter(torch.empty(()))
        self.threshold = nn.Parameter(torch.empty(()))  # L
        self.reset_parameters()

    @classmethod
    def _check(cls, options: dict[str, Any], n_head: int) -> None:
        option_int("fire", "hidden", options["hidden"], 1)
        option_number("fire", "init_c", options["init_c"], positive=True)
        option_number("fire", "init_threshold", options["init_threshold"])

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.c.fill_(float(self.options["init_c"]))
            self.threshold.fill_(float(self.options["init_threshold"]))
            for layer in (self.mlp[0], self.mlp[2]):
                layer.reset_parameters()

    def _params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.c.clamp(min=MIN_C), self.threshold.clamp(min=MIN_THRESHOLD)

    @torch.no_grad()
    def constrain_(self) -> None:
        c, L = self._params()
        self.c.copy_(c)
        self.threshold.copy_(L)

    def normalized_distance(self, q_len: int, k_len: int) -> torch.Tensor:
        """The MLP's input psi(d) / psi(max(L, i)), (Tq, Tk); d clamped at 0 above the diagonal."""
        c, L = self._params()
        dev = self.c.device
        d = relative_distance(q_len, k_len, dev).clamp(min=0).to(c.dtype)
        i = query_positions(q_len, k_len, dev).to(c.dtype)
        return torch.log1p(c * d) / torch.log1p(c * torch.maximum(i, L))

    @torch.no_grad()
    def kernel_terms(self, seq_len: int) -> dict[str, torch.Tensor]:
        """What forms b_h(i, j) cell by cell where a kernel cannot hold (T, T) of it (the fused statistics kernels):
        ψ(d) for d = 0 .. T - 1 and ψ(max(L, i)) for i = 0 .. T - 1, by the operations :meth:`rows` takes them by, and
        the MLP's weights, ``w1``, ``b1`` (hidden,), ``w2`` (H, hidden), ``b2`` (H,)."""
        c, L = self._params()
        positions = torch.arange(seq_len, device=c.device).to(c.dtype)
        first, second = self.mlp[0], self.mlp[2]
        return {"psi_d": torch.log1p(c * positions), "psi_i": torch.log1p(c * torch.maximum(positions, L)),
                "w1": first.weight[:, 0].detach(), "b1": first.bias.detach(), "w2": second.weight.detach(),
                "b2": second.bias.detach()}  # fmt: skip

    def bias(self, x: torch.Tensor | None, q_len: int, k_len: int) -> torch.Tensor:
        u = self.normalized_distance(q_len, k_len)  # (Tq, Tk)
        out = self.mlp(u[..., None])  # (Tq, Tk, H)
        return out.permute(2, 0, 1)[None]  # (1, H, Tq, Tk)

    def rows(self, x: torch.Tensor | None) -> RowsFn:
        """Query blocks from per-forward tables of psi(d) and psi(max(L, i)), the MLP run on cache-sized
        pieces of cells (its hidden activations are 32 times the block) and written head-major: a
        contiguous (1, H, rows, r1), the layout SDPA reads. The same operations as :meth:`bias`, so the
        same bits."""
        c, L = self._params()
        psi_d = psi_i = None
        if x is not None:
            T = x.shape[1]
            d = torch.arange(T - 1, -T, -1, device=c.device).clamp(min=0).to(c.dtype)  # (2T - 1,): T-1 .. 1-T
            psi_d = torch.log1p(c * d)[None]  # (1, 2T - 1)
            psi_i = torch.log1p(c * torch.maximum(torch.arange(T, device=c.device).to(c.dtype), L))  # (T,)
        first, second = self.mlp[0], self.mlp[2]

        def block(r0: int, r1: int) -> torch.Tensor:
            if psi_d is None:
                u = self.normalized_distance(r1 - r0, r1)  # (rows, r1)
            else:
                u = toeplitz_rows(psi_d, psi_i.shape[0], r0, r1)[0, 0] / psi_i[r0:r1, None]  # (rows, r1)
            u = u.reshape(-1, 1)  # (rows * r1, 1)
            n = u.shape[0]
            if n < MIN_MLP_CELLS:  # padded, so that the values are bit-equal to those of bias(x, T, T)
                return self.mlp(torch.cat([u, u.new_zeros(MIN_MLP_CELLS - n, 1)]))[:n].T.reshape(1, -1, r1 - r0, r1)
            out = torch.empty(self.n_head, n, dtype=second.weight.dtype, device=u.device)  # (H, rows * r1)
            piece = max(MLP_CELLS, GPU_MLP_CELLS) if gpu_shaped(u.device) else MLP_CELLS
            size = -(-n // -(-n // piece))  # pieces of equal size, none below MIN_MLP_CELLS
            for a in range(0, n, size):
                hidden = torch.relu_(first(u[a : a + size]))  # (piece, hidden)
                # the matmul of nn.Linear written transposed (the same BLAS call): (H, piece), no copy
                torch.addmm(second.bias[:, None], second.weight, hidden.T, out=out[:, a : a + size])
            return out.view(1, self.n_head, r1 - r0, r1)  # (1, H, rows, r1)

        return block
