"""What is known of a score tensor between its q.kᵀ product and the softmax, for :mod:`biasviz.tracing.eager`.

The terms added to it (each replayed, scaled and reshaped as the scores were, only for a call recorded), what
broke its additivity, and the product's own operands, from which the call's q and k are formed again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

Step = tuple[str, tuple[int, ...]]


@dataclass(frozen=True)
class Term:
    """One tensor added to the scores, and what the scores went through since (replayed only when recorded)."""

    tensor: torch.Tensor
    shape: tuple[int, ...]  # the scores' shape when it was added
    factor: float = 1.0
    steps: tuple[Step, ...] = ()
    learned: bool = False  # made from the model's parameters: a bias even where its values are 0

    def formed(self) -> torch.Tensor:
        t = self.tensor
        if self.steps:
            t = t.expand(self.shape)
            for kind, arg in self.steps:
                t = t.permute(arg) if kind == "permute" else t.reshape(arg)
        return t.float() if self.factor == 1.0 else t.float() * self.factor


@dataclass(frozen=True)
class Scores:
    """What is known of a score tensor since its product: the terms added and what broke additivity."""

    terms: tuple[Term, ...] = ()
    note: str = ""
    columns: tuple[int, int] | None = None  # (start, stop) of the real keys after a cat with sink columns
    axes: tuple[int, int] = (-2, -1)  # where its query and key dimensions are (moved by a permute)
    moved: bool = False  # its cells were moved (gathered, shifted): a term to add, not the scores themselves
    # the product's own operands (and einsum equation), its scale since and its reshapes: q and k, when asked
    operands: tuple[torch.Tensor, torch.Tensor] | None = None
    equation: str | None = None
    scale: float = 1.0
    steps: tuple[Step, ...] = ()
    lead: tuple[int, ...] | None = None  # the product's leading dimensions
    # an elementwise step that is not additive (softcapping) after a plain scale·q·kᵀ: the scale it met, so that the
    # scores the call's inputs give (docs/hdf5.md, 'Attended cells') and the positional logits are formed before it
    capped_at: float | None = None
    # a per-row constant was added (the row maximum subtracted for stability, as GPT-OSS does): the softmax cannot see
    # it, but the scores the call's inputs give are formed again from q and k rather than read shifted
    shifted: bool = False
    # H where the product's operands were (B, H, T, d) tensors folded into (B·H, T, d) (:mod:`biasviz.tracing.folds`)
    folded: int = 1

    def stepped(self, step: Step) -> Scores:
        terms = tuple(replace(t, steps=(*t.steps, step)) for t in self.terms)
        return replace(self, terms=terms, steps=(*self.steps, step))

    def scaled(self, factor: float) -> Scores:
        terms = tuple(replace(t, factor=t.factor * factor) for t in self.terms)
        return replace(self, terms=terms, scale=self.scale * factor)

    def q_and_k(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The product's q (..., Tq, E) and k (..., Tk, E), reshaped as the scores were since, so that the scores
        are scale·q·kᵀ + bias; None where that cannot be followed (an einsum of another form, a moved axis)."""
        if self.operands is None or self.lead is None or self.axes != (-2, -1):
            return None
        pair = _canonical(self.operands, self.equation)
        if pair is None:
            return None
        q, k = (t.expand(*self.lead, *t.shape[-2:]) for t in pair)
        for kind, arg in self.steps:
            if kind == "permute" and arg[-2:] != (len(arg) - 2, len(arg) - 1):
                return None  # the query or key dimension moved and back: not followed for q and k
            q, k = (t.permute(arg) if kind == "permute" else t.reshape(*arg[:-2], *t.shape[-2:]) for t in (q, k))
        return q, k

    def folded_heads(self, shape: tuple[int, ...]) -> int:
        """H where scores of ``shape`` (B·H, Tq, Tk) went through a (B, H, Tq, Tk) view on their way, or else were the
        product of q and k folded from (B, H, T, d) (:attr:`folded`): heads folded into the batch for ``bmm``
        (fairseq's attention, XGLM's, FSMT's), which the view unfolds; 1 otherwise (one head a sample).

        >>> Scores(steps=(("reshape", (2, 4, 5, 5)), ("reshape", (8, 5, 5)))).folded_heads((8, 5, 5))
        4
        >>> Scores(folded=4).folded_heads((8, 5, 5)), Scores(folded=3).folded_heads((8, 5, 5))
        (4, 1)
        """
        if len(shape) != 3:
            return 1
        for kind, arg in reversed(self.steps):
            if kind == "reshape" and len(arg) == 4 and arg[0] * arg[1] == shape[0] and tuple(arg[2:]) == shape[1:]:
                return int(arg[1])
        # no view (an encoder's call with no mask to add): the heads its q and k were folded from
        return self.folded if self.folded > 1 and shape[0] % self.folded == 0 else 1

    def bias(self) -> torch.Tensor | None:
        """The sum of the terms, formed (float32, broadcastable to the scores), or None."""
        total = None
        for term in self.terms:
            total = term.formed() if total is None else total + term.formed()
        return total

    def noted(self, note: str) -> Scores:
        return replace(self, note=self.note or note)


def _canonical(operands: tuple[torch.Tensor, torch.Tensor],
               equation: str | None) -> tuple[torch.Tensor, torch.Tensor] | None:  # fmt: skip
    """A product's operands as q (..., Tq, E) and k (..., Tk, E): ``a @ b`` has b = kᵀ; an einsum is read from its
    equation (leading letters, then the query's and the key's, one letter summed over)."""
    a, b = operands
    if equation is None:
        return a, b.transpose(-2, -1)
    if "->" not in equation or "." in equation:
        return None
    inputs, out = equation.replace(" ", "").split("->")
    subs = inputs.split(",")
    if len(subs) != 2 or len(out) < 2:
        return None
    lead, row, col = out[:-2], out[-2], out[-1]
    summed = set(subs[0]) & set(subs[1]) - set(out)
    if len(summed) != 1:
        return None
    (e,) = summed
    pair = []
    for letter in (row, col):
        found = [(sub, t) for sub, t in zip(subs, operands, strict=True) if letter in sub]
        if len(found) != 1 or any(c not in out + e for c in found[0][0]):
            return None
        sub, t = found[0]
        have = "".join(c for c in lead if c in sub)
        x = torch.einsum(f"{sub}->{have}{letter}{e}", t)
        for position, c in enumerate(lead):
            if c not in sub:
                x = x.unsqueeze(position)
        pair.append(x)
    return pair[0], pair[1]
