"""Named capture points in the model, in the spirit of TransformerLens' ``HookPoint``.

Every attention layer owns two identity modules, ``blocks.{L}.attn.hook_bias`` and
``blocks.{L}.attn.hook_pattern``; their module path is their name. A forward hook on one of them sees
the tensor that passes there. :func:`capture` attaches hooks only for the duration of a ``with`` block.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator

import torch
from torch import nn

HOOK_BIAS = "hook_bias"  # [batch or 1, head, query, key] additive bias, before the causal mask
HOOK_PATTERN = "hook_pattern"  # [batch, head, query, key] post-softmax attention weights


def hook_name(layer: int, point: str) -> str:
    """The dotted name of a capture point, e.g. ``hook_name(11, "hook_pattern")``.

    >>> hook_name(11, HOOK_PATTERN)
    'blocks.11.attn.hook_pattern'
    """
    return f"blocks.{layer}.attn.{point}"


class HookPoint(nn.Module):
    """An identity module whose only job is to be a place where forward hooks can be attached."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """True when some hook listens here (the attention then forms what passes through it)."""
        return bool(self._forward_hooks)


NamesFilter = str | list[str] | Callable[[str], bool] | None
HookFn = Callable[[torch.Tensor, str], None]


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every capture point of ``model`` by name."""
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, HookPoint)}


def _matcher(names: NamesFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda _: True
    if callable(names):
        return names
    patterns = [names] if isinstance(names, str) else list(names)
    return lambda n: any(fnmatch.fnmatchcase(n, p) for p in patterns)


@contextlib.contextmanager
def capture(model: nn.Module, names: NamesFilter, fn: HookFn) -> Iterator[list[str]]:
    """Call ``fn(tensor, name)`` for every tensor passing the matching capture points.

    ``names`` is a name, a glob (``blocks.*.attn.hook_pattern``), a list of them, or a predicate.
    The hooks are removed when the block exits, even on error. Yields the matched names.
    """
    match = _matcher(names)
    points = {n: p for n, p in hook_points(model).items() if match(n)}
    if not points:
        raise KeyError(f"no capture point matches {names!r}")
    handles = []
    try:
        for name, point in points.items():

            def _hook(_mod: nn.Module, _inp: tuple, out: torch.Tensor, _name: str = name) -> None:
                fn(out, _name)

            handles.append(point.register_forward_hook(_hook))
        yield list(points)
    finally:
        for h in handles:
            h.remove()
