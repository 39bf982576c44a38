"""The probe of a placed model reads no weight of the layers after the last one asked for.

A traced model is run once over a few tokens (the probe) to count its attention calls. With a device map, each
offloaded module's weights are read (from memory or from the disk) by accelerate's hook every time it runs, so a
probe through the whole model reads every layer once, those after ``--layer L`` too. Past the last call asked for,
nothing the probe records is used but the number of calls, which does not depend on the weights' values: there the
offloaded modules run on zeros of their weights' shapes and precision, and nothing is read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch import nn


def last_asked(spec: Any) -> int | None:
    """The largest layer of ``--layer`` when every one is counted from the start (None: -1, "all" or unknown).

    >>> last_asked(1), last_asked([0, 3]), last_asked("0,2"), last_asked(-1), last_asked("all")
    (1, 3, 2, None, None)
    """
    items = spec if isinstance(spec, (list, tuple)) else str(spec).split(",")
    try:
        layers = [int(x) for x in items]
    except (TypeError, ValueError):
        return None
    return max(layers) if layers and min(layers) >= 0 else None


@contextlib.contextmanager
def unread_after(model: nn.Module, calls: Callable[[], int], last: int | None) -> Iterator[None]:
    """Within the block, an offloaded module that starts once ``calls()`` (the calls seen so far) has passed ``last``
    runs on zeros instead of its weights."""
    offloaded = [(m, h) for m in model.modules() for h in _offload_hooks(m)] if last is not None else []
    swapped: list[tuple[Any, Any]] = []

    def before(module: nn.Module, _args: Any) -> None:
        if calls() <= last:
            return
        for hook in _offload_hooks(module):
            if not isinstance(hook.weights_map, _Zeros):
                swapped.append((hook, hook.weights_map))
                hook.weights_map = _Zeros(module)

    handles = [m.register_forward_pre_hook(before) for m in {id(m): m for m, _ in offloaded}.values()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for hook, weights in reversed(swapped):
            hook.weights_map = weights


def _offload_hooks(module: nn.Module) -> list[Any]:
    """accelerate's hooks on ``module`` that bring its weights from an offload map each time it runs."""
    hook = getattr(module, "_hf_hook", None)
    hooks = getattr(hook, "hooks", None) or ([hook] if hook is not None else [])
    return [h for h in hooks if getattr(h, "offload", False) and getattr(h, "weights_map", None) is not None]


class _Zeros(Mapping):
    """The offload map of one module as zeros: each name gives zeros of the shape and precision its tensor has."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __getitem__(self, name: str) -> torch.Tensor:
        owner, _, leaf = name.rpartition(".")
        held = getattr(self.module.get_submodule(owner) if owner else self.module, leaf)
        return torch.zeros(held.shape, dtype=held.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(dict(self.module.named_parameters()))

    def __len__(self) -> int:
        return len(dict(self.module.named_parameters()))
