"""What a trace (:mod:`biasviz.tracing.mode`) does around the calls it forms: ``layers`` and ``stop`` end the forward
after the last call asked for, a compiled model runs eagerly while traced, and a trace inside a trace records each
call once in each."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import biasviz
from tests import nano_gpt
from tests.tracing.test_calls import _qkv, close


def test_stop_after_the_last_requested_call_and_only_it_is_formed() -> None:
    q, k, v = _qkv()
    ran = []
    with biasviz.trace(layers=[1], stop=True) as t:
        for i in range(4):
            F.scaled_dot_product_attention(q, k, v, is_causal=True)
            ran.append(i)
    assert ran == [0] and len(t.calls) == 2 and list(t.weights) == [1]
    with pytest.raises(ValueError, match="call indices from 0"):
        biasviz.trace(layers=[-1])


def test_a_compiled_model_is_traced_eagerly() -> None:
    fused, explicit = nano_gpt.pair()
    idx = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), biasviz.trace(fused) as t:
        torch.compile(fused)(idx)
    with torch.no_grad():
        explicit(idx)
    assert close(t.weights[2], explicit.transformer.h[2].attn.last_att)


@pytest.mark.parametrize("which", ["fused", "explicit"])
def test_a_trace_inside_a_trace_records_each_call_once_in_each(which: str) -> None:
    """The inner trace forms its calls with torch operations of its own: the outer one must not take them for
    the model's (an SDPA call was recorded twice by the outer trace, once as itself and once as eager q.kᵀ)."""
    model = dict(zip(("fused", "explicit"), nano_gpt.pair(), strict=True))[which]
    idx = torch.randint(0, 101, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad(), biasviz.trace(model) as alone:
        model(idx)
    with torch.no_grad(), biasviz.trace(model) as outer, biasviz.trace(model) as inner:
        model(idx)
    for t in (outer, inner):
        assert [c.kind for c in t.calls] == [c.kind for c in alone.calls] and len(alone.calls) == 3
        for layer, w in alone.weights.items():
            assert torch.equal(t.weights[layer], w)
