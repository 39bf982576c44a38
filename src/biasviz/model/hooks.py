"""Named capture points in the model, in the spirit of TransformerLens' ``HookPoint``.

Every attention layer owns identity modules ``blocks.{L}.attn.hook_bias`` and ``blocks.{L}.attn.hook_pattern``
(matrices, in blocks of rows) and ``hook_q``, ``hook_k`` (the whole sequence's queries and keys, as
TransformerLens lays them out); their module path is their name. A forward hook on one of them sees
the tensor that passes there. :func:`capture` attaches hooks only for the duration of a ``with`` block.

Without autograd the attention forms its matrices one block of query rows at a time, so a hook sees
each layer's matrix in pieces: the rows ``row0 .. row0 + rows - 1`` against keys ``0 .. row0 + rows - 1``
(a causal query sees no later key), shape [batch or 1, head, rows, keys] with keys = row0 + rows. With
autograd (training) it sees the whole matrix once: row0 = 0, rows = keys = T.
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator

import torch
from torch import nn

HOOK_BIAS = "hook_bias"  # [batch or 1, head, rows, keys] additive bias, before the causal mask
HOOK_PATTERN = "hook_pattern"  # [batch, head, rows, keys] post-softmax attention weights (0 past the diagonal)
HOOK_SCORES = "hook_scores"  # [batch, head, rows, keys] the softmax's input, scale * q.k + bias, before the mask
HOOK_Q = "hook_q"  # [batch, position, head, head dim] the queries as the scores take them (whole sequence)
HOOK_K = "hook_k"  # [batch, position, head, head dim] the keys


def hook_name(layer: int, point: str) -> str:
    """The dotted name of a capture point, e.g. ``hook_name(11, "hook_pattern")``.

    >>> hook_name(11, HOOK_PATTERN)
    'blocks.11.attn.hook_pattern'
    """
    return f"blocks.{layer}.attn.{point}"


class HookPoint(nn.Module):
    """An identity module whose only job is to be a place where forward hooks can be attached.

    ``row0`` is the first query row of the block ``x`` holds ([batch or 1, head, rows, row0 + rows]); a
    forward hook reads it from its inputs, and may return a replacement of the block's shape.
    """

    def forward(self, x: torch.Tensor, row0: int = 0) -> torch.Tensor:
        return x

    @property
    def active(self) -> bool:
        """True when some hook listens here (the attention then forms what passes through it)."""
        return bool(self._forward_hooks)


NamesFilter = str | list[str] | Callable[[str], bool] | None
HookFn = Callable[[torch.Tensor, str, int], None]  # (block [batch or 1, head, rows, row0 + rows], name, row0)


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
    """Call ``fn(tensor, name, row0)`` for every block of query rows passing the matching capture points.

    ``tensor`` is [batch or 1, head, rows, keys] holding query rows ``row0 .. row0 + rows - 1`` against keys
    ``0 .. keys - 1`` (keys = row0 + rows); a forward without autograd passes each matrix in several blocks.
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

            def _hook(_mod: nn.Module, args: tuple, kwargs: dict, out: torch.Tensor, _name: str = name) -> None:
                row0 = args[1] if len(args) > 1 else kwargs.get("row0", 0)
                fn(out, _name, int(row0))

            handles.append(point.register_forward_hook(_hook, with_kwargs=True))
        yield list(points)
    finally:
        for h in handles:
            h.remove()
