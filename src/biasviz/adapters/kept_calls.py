"""What a traced attention call kept for a summary attended: the cells every sample's rows are formed again over.

While every sample has one mask, a call keeps it once (:class:`KeptCall`, with the scale its rows are formed with); from
the first sample masked otherwise (padding, packed documents) on, each sample's own cells go into the bank beside its q
and k (:func:`own_cells`), one set for all heads or, where its heads attend cells of their own, one a head.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import torch

from biasviz.adapters.rows import plain_cells
from biasviz.common.errors import MasksDifferBySample
from biasviz.tracing.calls import SdpaOperands


@dataclass
class KeptCall:
    """What a kept call forms every sample's rows with: its scale and its mask (None: the call's rule, the causal
    triangle or, for a call that sees keys after its query, every cell)."""

    scale: float
    mask: torch.Tensor | None  # (1, 1 or H, Tq, Tk) bool, the cells attended to, where not the call's rule
    causal: bool = True  # the call's rule

    @classmethod
    def of(cls, ops: SdpaOperands, causal: bool) -> KeptCall:
        kept = ops.kept
        q_len, k_len = kept.shape[-2:]
        if bool((kept == plain_cells(0, q_len, k_len, causal, kept.device)).all()):
            return cls(ops.scale, None, causal)
        if kept.shape[0] > 1 and not bool((kept == kept[:1]).all()):
            raise MasksDifferBySample("an attention call masked different cells for samples of one batch: a summary "
                                      "forms one mask for every sample")  # fmt: skip
        return cls(ops.scale, kept[:1], causal)

    @functools.cached_property
    def digest(self) -> torch.Tensor:
        """(1, 32) uint8: the SHA-256 of the scale and mask (None: the call's rule), hashed once per call."""
        rule = b"causal" if self.causal else b"every key"
        mask = rule if self.mask is None else self.mask.contiguous().cpu().numpy().tobytes()
        raw = hashlib.sha256(repr(self.scale).encode() + mask).digest()
        return torch.tensor(list(raw), dtype=torch.uint8)[None]

    def same(self, other: KeptCall) -> bool:
        if self.scale != other.scale or (self.mask is None) != (other.mask is None):
            return False
        return self.mask is None or bool(torch.equal(self.mask, other.mask))

    def rows(self, r0: int, r1: int, device: torch.device, keys: int | None = None) -> torch.Tensor:
        """(1, 1 or H, rows, keys) bool: the cells of query rows r0 .. r1 - 1 that are attended to, of keys 0 ..
        ``keys`` - 1 (default r1: a causal call's)."""
        keys = r1 if keys is None else keys
        if self.mask is None:
            return plain_cells(r0, r1 - r0, keys, self.causal, device)
        return self.mask[..., r0:r1, :keys].to(device)


def own_cells(kept: torch.Tensor, batch: int) -> torch.Tensor:
    """(``batch``, 1 or H, T, T) bool: each sample's attended cells of a call from its mask ``kept`` (1 or B, 1 or H,
    T, T): one set for all heads where they agree, one a head where they do not."""
    cells = kept if kept.shape[1] > 1 and not bool((kept == kept[:, :1]).all()) else kept[:, :1]
    return cells.expand(batch, *cells.shape[1:]) if cells.shape[0] == 1 else cells


def added_bias(ops: SdpaOperands) -> torch.Tensor:
    """(1 or B, 1 or H, T, T) float32: the bias a call adds (its float mask's values) over the cells it attends, 0 on
    the others and where it adds none."""
    added = torch.zeros((), device=ops.kept.device) if ops.additive is None else ops.additive.float()
    return torch.where(ops.kept, added, 0.0)
