"""Which module made each attention call (:mod:`biasviz.tracing.owners`), on models whose calls are not their layers:
two calls in one attention module (DiffLlama's), attention in some layers only (a hybrid), a module used twice (shared
weights, ALBERT's), a call of the model's own forward, and calls inside modules nested deeper than the attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from biasviz.tracing import Trace
from biasviz.tracing.owners import MODEL_ITSELF, call_owners, shared_owners


class Attend(nn.Module):
    """``calls`` SDPA calls a forward, on the same q and k (DiffLlama's two: one per half of v)."""

    def __init__(self, calls: int = 1) -> None:
        super().__init__()
        self.proj, self.calls = nn.Linear(8, 8), calls

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x).view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
        for _ in range(self.calls):
            x = x + F.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(x.shape)
        return x


class Mix(nn.Module):
    """A layer that mixes without attention (a hybrid's recurrent or convolutional layer)."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mix(x)


class Block(nn.Module):
    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.norm, self.inner = nn.LayerNorm(8), inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.norm(x))


class Model(nn.Module):
    def __init__(self, layers: list[nn.Module], own_call: bool = False) -> None:
        super().__init__()
        self.layers, self.own_call = nn.ModuleList(layers), own_call

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        if self.own_call:  # attention in the model's own forward, outside every submodule
            q = x.view(x.shape[0], x.shape[1], 2, 4).transpose(1, 2)
            x = x + F.scaled_dot_product_attention(q, q, q).transpose(1, 2).reshape(x.shape)
        return x


def _owners(model: nn.Module) -> list[str]:
    trace = Trace(model, layers=[], inspect=True)
    with torch.inference_mode(), call_owners(model, lambda: len(trace.calls)) as owners, trace:
        model(torch.randn(1, 6, 8))
    assert len(owners) == len(trace.calls)
    return owners


def test_each_call_is_owned_by_the_innermost_module_running() -> None:
    model = Model([Block(Attend()), Block(Mix()), Block(Attend(calls=2)), Block(Mix())], own_call=True)
    assert _owners(model) == ["layers.0.inner", "layers.2.inner", "layers.2.inner", MODEL_ITSELF]


def test_a_hybrid_s_calls_are_the_layers_that_attend() -> None:
    model = Model([Block(Mix()), Block(Mix()), Block(Attend()), Block(Mix()), Block(Attend())])
    assert _owners(model) == ["layers.2.inner", "layers.4.inner"]
    assert shared_owners(_owners(model)) == {}


def test_a_module_run_twice_owns_both_calls() -> None:
    shared = Block(Attend())
    model = Model([shared, Block(Mix()), shared])  # weights shared across layers (ALBERT's)
    owners = _owners(model)
    assert owners == ["layers.0.inner", "layers.0.inner"]  # named_modules names a module once, where it first is
    assert shared_owners(owners) == {"layers.0.inner": [0, 1]}


def test_nothing_is_left_listening_after_the_block() -> None:
    from torch.nn.modules import module

    before = (len(module._global_forward_pre_hooks), len(module._global_forward_hooks))
    _owners(Model([Block(Attend())]))
    assert (len(module._global_forward_pre_hooks), len(module._global_forward_hooks)) == before
    model = Model([Block(Attend())])
    try:
        with call_owners(model, lambda: 0):
            raise RuntimeError("the forward failed")
    except RuntimeError:
        pass
    assert (len(module._global_forward_pre_hooks), len(module._global_forward_hooks)) == before
