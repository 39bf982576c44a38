"""The forms of a bias the fused kernels add beside a table of distance (H, T): a row of keys (:class:`KeyBias`),
FIRE's MLP formed in each tile (:class:`MlpBias`), a bias read cell by cell (:class:`CellBias`) and one that differs by
sample as a difference of two values a position (:class:`SampleEnds`: CABLE's, FoX's) or as a row of keys of its own
(:class:`SampleKeys`: BLOOM's beside padding). Plain tensors and named tuples, so that a caller can build them without
Triton."""

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


class KeyBias(NamedTuple):
    """A bias of the key alone, g_h(j), the same for every sample (BLOOM's, MPT's and Falcon's m_h·j, kept from a
    call): ``values`` (H, T). It changes along a diagonal, so the sums by distance hold it (a table of distance is
    taken off them)."""

    values: torch.Tensor

    def packed(self, device: torch.device) -> torch.Tensor:
        """(H, T) float32 on ``device``, contiguous, as the kernels read it."""
        return self.values.to(device=device, dtype=torch.float32).contiguous()

    def first(self) -> torch.Tensor:
        """(H,) float64 b_h(0, 0) = g_h(0)."""
        return self.values[:, 0].double()


class SampleEnds(NamedTuple):
    """A bias that differs by sample, b_a,h(i, j) = e_a,h(i) - e_a,h(j), from ``ends`` (N, H, T) float32: CABLE's and
    FoX's cumulative sums (:class:`~biasviz.schemes.base.ScoreTerms`' ``ends``), each sample's from its own input. The
    kernels form each sample's cells from two values a position, by the operation the model forms them by (so the same
    bits), and the mean bias over samples b̄ = ē(i) - ē(j) for P."""

    ends: torch.Tensor

    def packed(self, device: torch.device) -> torch.Tensor:
        """(N + 1, H, T) float32 as the kernels read it: each sample's ends, then their mean over samples (taken in
        float64)."""
        ends = self.ends.to(device)
        return torch.cat([ends.to(torch.float32), self.mean().to(device)[None]]).contiguous()

    def mean(self) -> torch.Tensor:
        """(H, T) float32 ē, the mean of e over samples, taken in float64."""
        return self.ends.double().mean(0).to(torch.float32)

    def first(self) -> torch.Tensor:
        """(H,) float64 b̄_h(0, 0): 0 (every cell of the diagonal is e(i) - e(i))."""
        return torch.zeros(self.ends.shape[1], dtype=torch.float64)

    def rows(self, sample: int, r0: int, r1: int) -> torch.Tensor:
        """Sample ``sample``'s bias of queries r0 .. r1 - 1 against keys 0 .. r1 - 1, (1, H, rows, r1), as the model
        forms it (:meth:`~biasviz.schemes.base.ScoreTerms.rows`)."""
        ends = self.ends[sample : sample + 1]
        return ends[:, :, r0:r1, None] - ends[:, :, None, :r1]

    def block_sums(self, block: int) -> torch.Tensor:
        """(N, H, nb, nb) float64: each sample's Σ over a block's causal cells of e(i) - e(j), with no cell formed:
        below the diagonal a block's sum is its keys' count times its rows' sum of e less its rows' count times its
        keys' sum; on it each row i adds (its block's keys up to i)·e(i) less the running sum of its block's e up to i.

        >>> SampleEnds(torch.tensor([[[0.0, 1.0, 3.0]]])).block_sums(2)[0, 0].tolist()  # (1, 0); (2, 0) and (2, 1)
        [[1.0, 0.0], [5.0, 0.0]]
        """
        n, heads, seq_len = self.ends.shape
        nb = -(-seq_len // block)
        pad = (0, nb * block - seq_len)
        e = torch.nn.functional.pad(self.ends.double(), pad).view(n, heads, nb, block)
        ones = torch.ones(seq_len, dtype=torch.float64, device=e.device)
        inside = torch.nn.functional.pad(ones, pad).view(nb, block)
        sums, counts = e.sum(-1), inside.sum(-1)  # (N, H, nb), (nb,)
        below = sums[..., :, None] * counts[None, :] - counts[:, None] * sums[..., None, :]
        below = below * torch.ones(nb, nb, dtype=torch.float64, device=e.device).tril(-1)
        on = (inside.cumsum(-1) * e - e.cumsum(-1)).mul(inside).sum(-1)  # (N, H, nb)
        return below + torch.diag_embed(on)

    def distance_sums(self, first_keys: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, H, T) float64 each, each sample's Σ over the causal cells at d = i - j of e(i) - e(j), over all of them
        and over those of the first keys j < ``first_keys``: what P's delete-one profile takes of a bias of each
        sample's own (:class:`~biasviz.summaries.positional_errors.BiasByDistance`'s sums), from running sums of e.

        >>> every, first = SampleEnds(torch.tensor([[[0.0, 1.0, 3.0]]])).distance_sums(1)
        >>> every[0, 0].tolist(), first[0, 0].tolist()  # d = 1: (1 - 0) + (3 - 1); d = 2: 3 - 0
        ([0.0, 3.0, 3.0], [0.0, 1.0, 3.0])
        """
        e = self.ends.double()
        seq_len = e.shape[-1]
        c = torch.nn.functional.pad(e.cumsum(-1), (1, 0))  # c[m] = Σ_{k < m} e(k)
        d = torch.arange(seq_len, device=e.device)
        every = c[..., -1:] - c[..., d] - c[..., seq_len - d]  # Σ_{i >= d} e(i) - Σ_{j <= T - 1 - d} e(j)
        first = torch.zeros_like(e)
        for j in range(min(first_keys, seq_len)):
            at = d[: seq_len - j]  # the distances whose cell at key j lies inside T
            first[..., at] += e[..., at + j] - e[..., j : j + 1]
        return every, first


class SampleKeys(NamedTuple):
    """A bias of the key alone that differs by sample, b_a,h(i, j) = g_a,h(j), from ``values`` (N, H, T): BLOOM's
    m_h·j with its positions starting after each sample's own padding, as the keeping forward banked it. Only where
    samples attend cells of their own (the padding): each sample's own values on its own cells (NaN where it attends
    none: never read)."""

    values: torch.Tensor

    def packed(self, device: torch.device) -> torch.Tensor:
        """(N + 1, H, T) float32 as the kernels read it (a sample's cells it does not attend as 0, never read), the
        last one the mean over samples (no P is formed where samples attend cells of their own: not read)."""
        values = self.values.to(device=device, dtype=torch.float32).nan_to_num(0.0)
        return torch.cat([values, values.mean(0, keepdim=True)]).contiguous()

    def first(self) -> torch.Tensor:
        """(H,) float64 b̄_h(0, 0): the mean of g_a(0) over the samples, as the last of :meth:`packed` holds it."""
        return self.values[:, :, 0].double().nan_to_num(0.0).mean(0)

    def rows(self, sample: int, r0: int, r1: int) -> torch.Tensor:
        """Sample ``sample``'s bias of queries r0 .. r1 - 1 against keys 0 .. r1 - 1, (1, H, rows, r1)."""
        g = self.values[sample]
        return g[None, :, None, :r1].expand(1, g.shape[0], r1 - r0, r1)


# what the kernels add: a table f (H, T) of distance d = i - j (a tensor), a row of keys, FIRE's MLP, cells, each
# sample's ends or row of keys
Bias = torch.Tensor | KeyBias | MlpBias | CellBias | SampleEnds | SampleKeys


def mlp_bias(scheme: Any, seq_len: int) -> MlpBias | None:
    """The :class:`MlpBias` of a scheme whose bias is an MLP of the interpolated distance, the same for every input
    (FIRE's :meth:`~biasviz.schemes.fire.FIRE.kernel_terms`); None for any other."""
    terms = getattr(scheme, "kernel_terms", None)
    if terms is None or getattr(scheme, "depends_on_input", True):
        return None
    return MlpBias(**terms(seq_len))
