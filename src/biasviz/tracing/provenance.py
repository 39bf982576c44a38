"""Which tensors come from the model's parameters alone: a learned bias table and what is looked up from it.

A float mask or an added term whose values are all 0 is a mask, not a bias, when the caller built it from
the input (a padding mask with no padding). A learned bias table that happens to hold zeros (BEiT's and
Swin's at initialisation, step 0 of a checkpoint series) is still a bias: one step later the same model
has non-zero values, and a series must not mix "no bias" with "a bias". The difference is where the values
come from, so the trace follows it. A tensor is

- *input* when it is one of the model's own arguments (token ids, pixels, an attention mask), a floating
  tensor made before the trace began (activations handed in), or made from any input;
- *learned* when it is made from at least one parameter and otherwise only from constants;
- *constant* otherwise: the model's buffers, integer tensors kept across calls (a cached relative-position
  index), tensors made from nothing or from a shape (``arange``, ``zeros``, ``*_like``, ``new_*``).

So the lookup of a relative-position table by a position index is learned, and the embedding of the token
ids, a linear layer applied to activations, or a mask built from the user's attention mask never are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from biasviz.tracing.identity import ByIdentity

CONSTANT, LEARNED, INPUT = 0, 1, 2
# made from a shape or a dtype only, whatever tensor they are called on
CREATE = frozenset({"zeros_like", "ones_like", "full_like", "empty_like", "new_zeros", "new_ones", "new_full",
                    "new_empty", "new_tensor", "size", "dim"})  # fmt: skip


class Provenance:
    """Tensors in flight that are learned, constant or input, weakly held by identity."""

    def __init__(self, model: torch.nn.Module | None) -> None:
        self._kind: ByIdentity[int] = ByIdentity()
        self.active = model is not None  # without the model its inputs are unknown: nothing is called learned
        if model is not None:
            for buffer in model.buffers():
                self._mark(buffer, CONSTANT)

    def _get(self, t: torch.Tensor) -> int:
        if isinstance(t, torch.nn.Parameter):
            return LEARNED
        kind = self._kind.get(t)
        if kind is not None:
            return kind
        return INPUT if t.is_floating_point() or t.is_complex() else CONSTANT

    def learned(self, t: Any) -> bool:
        """Whether ``t`` was made from the model's parameters and constants only (and at least one parameter)."""
        return self.active and isinstance(t, torch.Tensor) and self._get(t) == LEARNED

    def inputs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The model's own arguments (a forward pre-hook): input, whatever their dtype."""
        for t in _tensors(args, kwargs):
            self._mark(t, INPUT)

    def _mark(self, t: torch.Tensor, kind: int) -> None:
        if not isinstance(t, torch.nn.Parameter):  # (a tensor subclass that cannot be weakly held: not followed)
            self._kind.set(t, kind)

    def after(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Follow one operation that ran: its output is input if any argument is, else learned if any is."""
        if not self.active:
            return
        kind = CONSTANT if name in CREATE else max((self._get(t) for t in _tensors(args, kwargs)), default=CONSTANT)
        for t in _tensors((out,), {}):
            if kind == INPUT and (t.is_floating_point() or t.is_complex()):
                self._kind.drop(t)  # floating input is the default: nothing to hold
            else:
                self._mark(t, kind)


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[torch.Tensor]:
    """The tensors among the arguments, one level into lists and tuples (``cat``, ``meshgrid``)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list | tuple):
            yield from (x for x in a if isinstance(x, torch.Tensor))
