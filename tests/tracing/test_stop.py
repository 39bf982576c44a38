"""Ending a forward pass early (:mod:`biasviz.tracing.stop`): within ``stop_after(module)`` the pass ends quietly as
soon as the module has run, nothing after it runs, the hook leaves with the block, and the stopped pass's frames are
let go; other errors pass through."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import biasviz.tracing.stop as stop
from biasviz.tracing.stop import StopForward, stop_after


def _model() -> tuple[nn.Sequential, list[int]]:
    """Three layers, each noting its index once it has run."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    ran: list[int] = []
    for k, layer in enumerate(model):
        layer.register_forward_hook(lambda _m, _a, _out, k=k: ran.append(k))
    return model, ran


@pytest.mark.parametrize("last", [0, 1, 2])
def test_the_forward_ends_quietly_once_the_module_has_run(last: int) -> None:
    model, ran = _model()
    after: list[str] = []
    with stop_after(model[last]):
        model(torch.randn(3, 4))
        after.append("the rest of the block")
    assert ran == list(range(last + 1)) and after == []  # the pass ended where the module returned, quietly
    assert [len(m._forward_hooks) for m in model] == [1, 1, 1]  # the layers' own hooks only: the stop's has left
    ran.clear()
    model(torch.randn(3, 4))  # outside the block the whole model runs
    assert ran == [0, 1, 2]


def test_without_a_module_nothing_stops() -> None:
    model, ran = _model()
    done = []
    with stop_after(None):
        out = model(torch.randn(3, 4))
        done.append(out.shape)
    assert ran == [0, 1, 2] and done == [torch.Size([3, 4])]


def test_another_error_passes_through_and_the_hook_still_leaves() -> None:
    model, _ = _model()

    def fails(*_: object) -> None:
        raise ValueError("the model's own")

    model[0].register_forward_hook(fails)
    with pytest.raises(ValueError, match="the model's own"), stop_after(model[2]):
        model(torch.randn(3, 4))
    assert len(model[2]._forward_hooks) == 1


def test_a_stop_raised_outside_the_hook_is_swallowed_too() -> None:
    """The trace raises StopForward itself (biasviz.tracing.mode): a stop_after block ends it quietly as well."""
    model, _ = _model()
    with stop_after(model[2]):
        raise StopForward
    assert len(model[2]._forward_hooks) == 1
    with pytest.raises(StopForward), stop_after(None):  # without a module the block does not stop anything
        raise StopForward


def test_the_stopped_forwards_frames_are_let_go(monkeypatch: pytest.MonkeyPatch) -> None:
    """The swallowed stop carries no traceback: its frames (and the activations in them) go with the block."""
    raised: list[BaseException] = []

    class Recorded(StopForward):
        def __init__(self, *args: object) -> None:
            super().__init__(*args)
            raised.append(self)

    monkeypatch.setattr(stop, "StopForward", Recorded)
    model, ran = _model()
    with stop_after(model[1]):
        model(torch.randn(3, 4))
    (swallowed,) = raised
    assert ran == [0, 1] and swallowed.__traceback__ is None
