"""Which tensors come from the model's parameters alone (:mod:`biasviz.tracing.provenance`): a learned table and what
is looked up from it are learned, even where their values are all 0; what is made from the model's input (token ids,
an attention mask, activations) never is; what is made from a shape or from the model's buffers alone is constant.
Each case below the trace's is worked out by hand from the rules in the module's docstring."""

from __future__ import annotations

import gc
import weakref

import torch

import biasviz
from biasviz.tracing.provenance import Provenance
from tests.tracing.test_eager_reshapes import D, H, T


# --- through a trace -----------------------------------------------------------------------------------------------
class ZeroTable(torch.nn.Module):
    """A learned per-head, per-distance table that holds zeros, handed to SDPA as its float mask."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(H, 2 * T - 1))

    def forward(self, q: torch.Tensor, k: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
        i = torch.arange(T)
        bias = self.table[:, i[:, None] - i[None, :] + T - 1]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=bias)
        zero_mask = torch.zeros(q.shape[0], 1, 1, T).masked_fill(~padding[:, None, None, :], float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=zero_mask) + out


def test_a_zero_learned_table_is_a_bias_and_a_zero_padding_mask_is_not() -> None:
    g = torch.Generator().manual_seed(6)
    q, k = (torch.randn(2, H, T, D, generator=g) for _ in range(2))
    model = ZeroTable()
    with torch.no_grad(), biasviz.trace(model) as t:
        model(q, k, torch.ones(2, T, dtype=torch.bool))
    assert t.calls[0].adds_bias and torch.equal(t.bias[0], torch.zeros(1, H, T, T))
    assert not t.calls[1].adds_bias and 1 not in t.bias  # built from the input: a mask with nothing masked


# --- the rules, case by case ---------------------------------------------------------------------------------------
class Table(torch.nn.Module):
    """A learned per-head table (zeros, as at initialisation), an integer index buffer and a float buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.zeros(2, 5))
        self.register_buffer("index", torch.tensor([4, 2, 0]))
        self.register_buffer("scale", torch.ones(2, 1))


def _after(prov: Provenance, name: str, out: torch.Tensor, *args: object) -> torch.Tensor:
    """``out``, made by the operation ``name`` from ``args``, as the trace reports it."""
    prov.after(name, args, {}, out)
    return out


def test_a_parameter_and_what_is_looked_up_from_it_by_a_buffer_are_learned() -> None:
    model = Table()
    prov = Provenance(model)
    assert prov.learned(model.table) and not prov.learned(model.index) and not prov.learned(model.scale)
    looked_up = _after(prov, "__getitem__", model.table[:, model.index], model.table, (slice(None), model.index))
    assert prov.learned(looked_up) and not looked_up.any()  # learned though every value is 0
    scaled = _after(prov, "mul", looked_up * model.scale, looked_up, model.scale)  # with a buffer: still learned
    assert prov.learned(scaled)
    shaped = _after(prov, "view", scaled.view(-1), scaled, -1)
    assert prov.learned(shaped)
    assert not prov.learned(3.0) and not prov.learned(None)


def test_anything_made_from_the_input_is_not_learned() -> None:
    model = Table()
    prov = Provenance(model)
    ids = torch.tensor([[1, 3, 0]])
    prov.inputs((ids,), {})  # the model's own argument: input, integer though it is
    embedded = _after(prov, "__getitem__", model.table[:, ids], model.table, (slice(None), ids))
    assert not prov.learned(embedded)  # the embedding of token ids is no bias
    mask = _after(prov, "gt", ids > 0, ids, 0)  # an integer-kind tensor made from the input stays input
    first = _after(prov, "__getitem__", model.table[:, :3], model.table, (slice(None), slice(None, 3)))
    assert prov.learned(first)
    assert not prov.learned(_after(prov, "mul", first * mask, first, mask))
    activations = torch.randn(2, 5)  # a float tensor from before the trace: input
    added = _after(prov, "add", model.table + activations, model.table, activations)
    assert not prov.learned(added) and not prov.learned(activations)
    cat = _after(prov, "cat", torch.cat([model.table, activations]), [model.table, activations])  # one level into lists
    assert not prov.learned(cat)
    both = _after(prov, "cat", torch.cat([model.table, model.table]), [model.table, model.table])
    assert prov.learned(both)


def test_what_is_made_from_a_shape_is_constant_and_a_learned_term_added_to_it_learned() -> None:
    model = Table()
    prov = Provenance(model)
    activations = torch.randn(2, 5)
    zeros = _after(prov, "zeros_like", torch.zeros_like(activations), activations)  # from its shape only
    assert not prov.learned(zeros)
    assert prov.learned(_after(prov, "add", zeros + model.table, zeros, model.table))
    negated = _after(prov, "neg", -activations, activations)  # not a shape: input
    assert not prov.learned(_after(prov, "add", negated + model.table, negated, model.table))
    positions = torch.arange(5)  # an integer tensor made from nothing: constant
    assert prov.learned(_after(prov, "__getitem__", model.table[:, positions], model.table, (slice(None), positions)))


def test_a_learned_tensor_that_an_input_is_added_to_in_place_is_input() -> None:
    model = Table()
    prov = Provenance(model)
    bias = _after(prov, "clone", model.table.detach().clone(), model.table)
    assert prov.learned(bias)
    activations = torch.randn(2, 5)
    _after(prov, "add_", bias.add_(activations), bias, activations)  # the same tensor, now holding the input
    assert not prov.learned(bias)


def test_without_the_model_nothing_is_learned() -> None:
    table = torch.nn.Parameter(torch.zeros(2, 5))
    prov = Provenance(None)
    assert not prov.learned(table)
    assert not prov.learned(_after(prov, "mul", table * 2, table, 2))


def test_tensors_in_flight_are_held_weakly() -> None:
    model = Table()
    prov = Provenance(model)
    looked_up = _after(prov, "__getitem__", model.table[:, model.index], model.table, (slice(None), model.index))
    held = weakref.ref(looked_up)
    del looked_up
    gc.collect()
    assert held() is None  # the provenance does not keep the model's intermediate tensors alive
