"""Heads folded into the batch before a product: fairseq's attention (FSMT, MVP, hand-written research code) reshapes
q and k from (B, H, T, d) to (B·H, T, d) for ``bmm``, so its scores are (B·H, Tq, Tk).

Where a mask is added, the scores go through a (B, H, Tq, Tk) view on their way, which says H
(:meth:`~biasviz.tracing.scores.Scores.folded_heads`); an encoder's call with no mask has no such view, and its scores
would read as one head a sample of B·H samples. :class:`FoldedHeads` remembers, weakly and by identity, the tensors a
reshape made by folding a (B, H, T, d) tensor's first two dimensions, and carries that through the steps fairseq takes
before the product (a transpose of k, a scale, a copy), so that the product's scores know H.
"""

from __future__ import annotations

from typing import Any

import torch

from biasviz.tracing.identity import ByIdentity

FOLDS = frozenset({"view", "reshape", "flatten"})
# steps after which a folded tensor is still one (B·H, ...) tensor of the same heads
KEEPS = frozenset({"transpose", "contiguous", "clone", "to", "float", "mul", "__mul__", "__rmul__", "div",
                   "__truediv__", "detach"})  # fmt: skip


class FoldedHeads:
    """Tensors whose first dimension is B·H, heads folded into the batch by a reshape, weakly held by identity."""

    def __init__(self) -> None:
        self._heads: ByIdentity[int] = ByIdentity()

    def heads(self, t: Any) -> int | None:
        """H where ``t`` is (B·H, ...) made by folding a (B, H, ...) tensor; None otherwise."""
        return self._heads.get(t)

    def after(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Follow one operation that ran: a fold of (B, H, T, d) into (B·H, T, d) is noted, and carried through the
        steps that keep it."""
        x = args[0] if args else kwargs.get("input")
        if not isinstance(x, torch.Tensor) or not isinstance(out, torch.Tensor) or out.dim() != 3:
            return
        if name in FOLDS and x.dim() == 4 and out.shape[0] == x.shape[0] * x.shape[1] > x.shape[0] \
                and out.shape[1:] == x.shape[2:]:  # fmt: skip
            self._heads.set(out, int(x.shape[1]))
        elif name in KEEPS and (h := self.heads(x)) is not None and out.shape[0] == x.shape[0]:
            self._heads.set(out, h)
