"""Which module of a model makes each attention call: the innermost of its named modules running when the call is made.

A traced model's layers are its attention calls, numbered in the order it makes them. In a plain decoder call L is
decoder layer L, but not in every model: DiffLlama's attention makes two calls a layer (one per half of the values),
and a hybrid model (Jamba, Zamba2, Bamba, Qwen3-Next) attends only in some of its layers, so its call 0 may be
layer 4's. The module that made each call (``model.layers.4.self_attn``) says which is which, in the file and in
``biasviz info``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from torch import nn

MODEL_ITSELF = ""  # a call made by the model's own forward, outside any of its submodules


@contextlib.contextmanager
def call_owners(model: nn.Module, calls: Callable[[], int]) -> Iterator[list[str]]:
    """Within the block, the list yielded fills with the name (as ``model.named_modules()`` gives it) of the innermost
    submodule of ``model`` running when each attention call was made, ``calls()`` counting the calls made so far;
    :data:`MODEL_ITSELF` for a call outside every submodule. Complete once the block ends."""
    names = {id(module): name for name, module in model.named_modules() if name}
    owners: list[str] = []
    running: list[str] = []

    def settle() -> None:  # the calls made since the last module began or ended were made by the innermost one running
        owners.extend([running[-1] if running else MODEL_ITSELF] * (calls() - len(owners)))

    def begin(module: nn.Module, args: object) -> None:
        if (name := names.get(id(module))) is not None:
            settle()
            running.append(name)

    def end(module: nn.Module, args: object, output: object) -> None:
        if (name := names.get(id(module))) is not None and running and running[-1] == name:
            settle()
            running.pop()

    handles = [nn.modules.module.register_module_forward_pre_hook(begin),
               nn.modules.module.register_module_forward_hook(end)]  # fmt: skip
    try:
        yield owners
    finally:
        for handle in handles:
            handle.remove()
        settle()


def shared_owners(owners: Sequence[str]) -> dict[str, list[int]]:
    """The modules that made more than one call, with the calls each made, in order.

    >>> shared_owners(["layers.0.attn", "layers.0.attn", "layers.1.attn"])
    {'layers.0.attn': [0, 1]}
    """
    made: dict[str, list[int]] = {}
    for index, owner in enumerate(owners):
        made.setdefault(owner, []).append(index)
    return {owner: calls for owner, calls in made.items() if len(calls) > 1}
