"""What the trace knows of a tensor lives as long as the tensor (:mod:`biasviz.tracing.identity`): held by identity,
weakly, so a new tensor at a freed one's address is never taken for it."""

from __future__ import annotations

import gc

import torch

from biasviz.tracing.identity import ByIdentity


def test_a_value_lives_as_long_as_its_tensor() -> None:
    held: ByIdentity[str] = ByIdentity()
    a, b = torch.zeros(3), torch.ones(3)
    held.set(a, "a")
    assert held.get(a) == "a" and held.get(b) is None and held.get("not a tensor") is None and held
    assert [(t is a, v) for t, v in held.items()] == [(True, "a")]
    del a
    gc.collect()
    assert not held and list(held.items()) == []


def test_a_tensor_at_a_freed_one_s_address_is_not_it() -> None:
    held: ByIdentity[int] = ByIdentity()
    seen = 0
    for _ in range(50):  # CPython reuses addresses: some new tensor lands where a freed one was
        t = torch.zeros(2)
        assert held.get(t) is None
        held.set(t, 1)
        seen += len(list(held.items()))
        del t
    assert seen == 50 and not held


def test_drop_and_clear() -> None:
    held: ByIdentity[int] = ByIdentity()
    a, b = torch.zeros(1), torch.zeros(1)
    held.set(a, 1)
    held.set(b, 2)
    held.drop(a)
    assert held.get(a) is None and held.get(b) == 2
    held.clear()
    assert held.get(b) is None and not held
