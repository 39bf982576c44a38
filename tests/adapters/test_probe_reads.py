"""The probe of a placed model reads no weight of the layers after the last one asked for
(:mod:`biasviz.adapters.probe_reads`): which layer ``--layer`` asks for last; within the block, a module that accelerate
brings its weights to from an offload map runs on zeros once the calls counted have passed that layer (its output
then the zeros a linear layer of zero weights gives), nothing of its map is read, and after the block every map is
the one it was. A three-layer model offloaded by accelerate's own ``cpu_offload``; its reference a copy kept in
memory. (A whole placed run, the disk's reads recorded: test_offload_reads.py.)"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping

import pytest
import torch
from torch import nn

from biasviz.adapters.probe_reads import last_asked, unread_after

pytest.importorskip("accelerate")


@pytest.mark.parametrize(("spec", "last"), [
    (1, 1), (0, 0), ([0, 3], 3), ((2, 5, 1), 5), ("0,2", 2), ("1, 3", 3), ("7", 7),
    (-1, None), ("all", None), ([0, -1], None), ("", None), ([], None), ("a,b", None), (None, None),
])  # fmt: skip
def test_the_last_layer_asked_for_when_every_one_counts_from_the_start(spec: object, last: int | None) -> None:
    assert last_asked(spec) == last


class Recording(Mapping):
    """An offload map that notes every name read from it."""

    def __init__(self, inner: Mapping, read: list[str], layer: int) -> None:
        self.inner, self.read, self.layer = inner, read, layer

    def __getitem__(self, name: str) -> torch.Tensor:
        self.read.append(f"{self.layer}.{name}")
        return self.inner[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.inner)

    def __len__(self) -> int:
        return len(self.inner)


def _offloaded() -> tuple[nn.Sequential, nn.Sequential, list[str], list[int], dict[int, torch.Tensor]]:
    """(model offloaded by accelerate, its copy in memory, names read from its maps, calls counted, layer outputs)."""
    from accelerate import cpu_offload

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4))
    reference = copy.deepcopy(model)
    cpu_offload(model, execution_device=torch.device("cpu"))
    read: list[str] = []
    calls = [0]
    outputs: dict[int, torch.Tensor] = {}
    for k, layer in enumerate(model):
        assert layer.weight.is_meta  # its weights live in the offload map only
        layer._hf_hook.weights_map = Recording(layer._hf_hook.weights_map, read, k)

        def counted(_m: nn.Module, _a: object, out: torch.Tensor, k: int = k) -> None:
            outputs[k] = out.detach()
            calls[0] += 1

        layer.register_forward_hook(counted)
    return model, reference, read, calls, outputs


@pytest.mark.parametrize("last", [0, 1])
def test_layers_after_the_last_asked_run_on_zeros_and_read_nothing(last: int) -> None:
    model, reference, read, calls, outputs = _offloaded()
    maps = [layer._hf_hook.weights_map for layer in model]
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = [reference[0](x)]
        expected += [reference[1](expected[0]), reference[2](reference[1](expected[0]))]
        with unread_after(model, lambda: calls[0], last):
            model(x)
    for k in range(3):
        want = expected[k] if k <= last else torch.zeros(3, 4)  # zero weights and zero bias: zeros, whatever the input
        torch.testing.assert_close(outputs[k], want, atol=1e-6, rtol=0)
    assert sorted({name.split(".")[0] for name in read}) == [str(k) for k in range(last + 1)]
    assert all(layer._hf_hook.weights_map is m for layer, m in zip(model, maps, strict=True))  # every map as it was
    read.clear()
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected[2], atol=1e-6, rtol=0)  # read again after the block
    assert sorted({name.split(".")[0] for name in read}) == ["0", "1", "2"]


def test_with_no_last_layer_every_weight_is_read() -> None:
    model, reference, read, calls, _ = _offloaded()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), unread_after(model, lambda: calls[0], None):
        assert not any(layer._forward_pre_hooks for layer in model)
        torch.testing.assert_close(model(x), reference(x), atol=1e-6, rtol=0)
    assert sorted({name.split(".")[0] for name in read}) == ["0", "1", "2"]


def test_the_maps_come_back_when_the_forward_fails() -> None:
    model, _, _, calls, _ = _offloaded()
    maps = [layer._hf_hook.weights_map for layer in model]
    with pytest.raises(RuntimeError, match="stopped"), unread_after(model, lambda: calls[0], 0), torch.no_grad():
        model(torch.randn(3, 4))  # layers 1 and 2 ran on zeros
        raise RuntimeError("stopped")
    assert all(layer._hf_hook.weights_map is m for layer, m in zip(model, maps, strict=True))
    assert not any(layer._forward_pre_hooks for layer in model)


def test_a_model_in_memory_is_left_alone() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    x = torch.randn(2, 4)
    with torch.no_grad():
        before = model(x)
        with unread_after(model, lambda: 5, 0):
            assert not any(layer._forward_pre_hooks for layer in model)
            torch.testing.assert_close(model(x), before, atol=0, rtol=0)
