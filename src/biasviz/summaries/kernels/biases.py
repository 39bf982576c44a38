"""The forms of a bias the fused kernels add beside a table of distance or of keys, (H, T): FIRE's MLP formed in each
tile (:class:`MlpBias`) and a bias read cell by cell (:class:`CellBias`). Plain tensors and named tuples, so that a
caller can build them without Triton."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class MlpBias(NamedTuple):
    """FIRE's bias b_h(i, j) = MLP(ψ(i - j) / ψ(max(L, i)))_h as the kernels form it, cell by cell in each tile
    (:meth:`~biasviz.schemes.fire.FIRE.kernel_terms`): ψ(d) for d = 0 .. T - 1 (``psi_d``), ψ(max(L, i)) for i = 0 ..
    T - 1 (``psi_i``), and the MLP's first layer ``w1``, ``b1`` (hidden,) and second ``w2`` (H, hidden), ``b2`` (H,).
    A table of T² cells per head would be what the kernels exist not to write."""

    psi_d: torch.Tensor
    psi_i: torch.Tensor
    w1: torch.Tensor
    b1: torch.Tensor
    w2: torch.Tensor
    b2: torch.Tensor

    def packed(self, device: torch.device) -> torch.Tensor:
        """One float32 vector [ψ(d), ψ(max(L, i)), w1, b1, w2 by rows, b2], as the kernels read it."""
        parts = (self.psi_d, self.psi_i, self.w1, self.b1, self.w2.reshape(-1), self.b2)
        return torch.cat([p.reshape(-1).to(device=device, dtype=torch.float32) for p in parts])

    def first(self) -> torch.Tensor:
        """(H,) float64 b_h(0, 0): the MLP at u = 0 (ψ(0) = 0)."""
        return self.w2.double() @ torch.relu(self.b1.double()) + self.b2.double()


class CellBias(NamedTuple):
    """A bias the kernels read cell by cell, (1 or H, T, T) ``values`` over the causal triangle (anything above it is
    never read): one a forward kept in no smaller form, the same for every sample (a traced call's float mask that is
    neither a table of j - i nor a row of keys)."""

    values: torch.Tensor

    def packed(self, device: torch.device) -> torch.Tensor:
        """The values as float32 on ``device``, contiguous (T² floats a head: they are already held so)."""
        return self.values.to(device=device, dtype=torch.float32).contiguous()

    def first(self) -> torch.Tensor:
        """(H or 1,) float64 b_h(0, 0)."""
        return self.values[:, 0, 0].double()


Bias = torch.Tensor | MlpBias | CellBias  # what the kernels add: a table (H, T) of distance or of keys, or formed


def mlp_bias(scheme: Any, seq_len: int) -> MlpBias | None:
    """The :class:`MlpBias` of a scheme whose bias is an MLP of the interpolated distance, the same for every input
    (FIRE's :meth:`~biasviz.schemes.fire.FIRE.kernel_terms`); None for any other."""
    terms = getattr(scheme, "kernel_terms", None)
    if terms is None or getattr(scheme, "depends_on_input", True):
        return None
    return MlpBias(**terms(seq_len))
