"""Tensors in flight, keyed by identity and weakly held: what the trace knows of each (a score tensor's history, where a
tensor came from, heads folded into its batch) lives exactly as long as the tensor does, and a new tensor that reuses a
freed one's ``id`` is never taken for it."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from typing import Any, Generic, TypeVar

import torch

V = TypeVar("V")


class ByIdentity(Generic[V]):
    """A value per live tensor, by identity; a tensor that cannot be weakly referenced (a subclass) is not held."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[weakref.ref, V]] = {}

    def __bool__(self) -> bool:
        return bool(self._held)

    def get(self, t: Any) -> V | None:
        """``t``'s value, or None (not held, or no tensor)."""
        if not isinstance(t, torch.Tensor):
            return None
        entry = self._held.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None

    def set(self, t: torch.Tensor, value: V) -> None:
        key = id(t)

        def gone(ref: weakref.ref, key: int = key) -> None:
            entry = self._held.get(key)
            if entry is not None and entry[0] is ref:
                del self._held[key]

        with contextlib.suppress(TypeError):
            self._held[key] = (weakref.ref(t, gone), value)

    def drop(self, t: torch.Tensor) -> None:
        self._held.pop(id(t), None)

    def clear(self) -> None:
        self._held.clear()

    def items(self) -> Iterator[tuple[torch.Tensor, V]]:
        """Every live tensor held and its value."""
        for ref, value in list(self._held.values()):
            if (t := ref()) is not None:
                yield t, value
