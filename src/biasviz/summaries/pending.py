"""Additions that can wait: a block of rows formed again (a bias measured to differ part-way) must count once.

The replayed path forms a block of query rows for every sample and only then learns whether the block stands or
is formed again; every per-sample accumulator fed in that loop holds its additions from :meth:`Pending.hold` until
:meth:`Pending.commit` (or drops them on :meth:`Pending.discard`). Outside a hold, additions go in at once.
"""

from __future__ import annotations

from typing import Any

import torch


class Pending:
    """Running sums whose additions may be held back (see the module). Held additions to the same place of the same
    sum are added up as they come (every sample of a block of rows into one place: one buffer, not one per sample)."""

    _pending: dict[tuple[int, str], list[Any]] | None = None  # (sum, where) -> [sum, where, amount so far]

    def _held(self) -> list[Pending]:
        """Other accumulators this one feeds, held, committed and discarded with it."""
        return []

    def hold(self) -> None:
        self._pending = {}
        for part in self._held():
            part.hold()

    def commit(self) -> None:
        for total, where, amount in (self._pending or {}).values():
            total[where] += amount
        self._pending = None
        for part in self._held():
            part.commit()

    def discard(self) -> None:
        self._pending = None
        for part in self._held():
            part.discard()

    def _target(self, total: torch.Tensor, where: Any) -> torch.Tensor:
        """Where an addition to ``total[where]`` goes, to be added to in place: that part of the sum itself, or while
        held, the one buffer that every addition to that place adds up in until :meth:`commit`."""
        if self._pending is None:
            return total[where]
        key = (id(total), repr(where))
        held = self._pending.get(key)
        if held is None:
            held = self._pending[key] = [total, where, torch.zeros_like(total[where])]
        return held[2]

    def _put(self, total: torch.Tensor, where: Any, amount: torch.Tensor | float) -> None:
        self._target(total, where).add_(amount)

    def _widened(self, total: torch.Tensor, heads: int) -> torch.Tensor:
        """``total`` (N, 1 or H, ...), a count kept with one head until cells differ by head, with at least ``heads``
        on its axis 1: itself where it has them, else a copy broadcast to them, to which additions held for ``total``
        go."""
        if total.shape[1] >= heads:
            return total
        with torch.inference_mode(False):  # called inside the model's forward: the count outlives it
            wide = total.expand(total.shape[0], heads, *total.shape[2:]).clone()
        for held in (self._pending or {}).values():
            if held[0] is total:
                held[0], held[2] = wide, held[2].expand(wide[held[1]].shape).clone()
        return wide
