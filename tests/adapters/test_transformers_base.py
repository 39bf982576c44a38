"""What every transformers adapter shares (:mod:`biasviz.adapters.transformers_base`): hooks on the captured layers'
attention modules only, gone with the block, the pass ended after the last; the scores of every adapter with their
q and k, against the library's own modules.

The tiny saved models and what their tests share are tests/adapters/tiny_transformers.py's.
"""

from __future__ import annotations

import pytest
import torch

from tests.adapters import tiny_transformers
from tests.adapters.tiny_transformers import (
    LAYER,
    T,
    _bloom_qk,
    _falcon_qk,
    _gpt2_qk,
    _load,
    _mpt_qk,
    _t5_qk,
)

dirs, ids = tiny_transformers.dirs, tiny_transformers.ids  # the saved models and the ids, fixtures of this file's own


# --- hooks --------------------------------------------------------------------------------------------------------


def test_hooks_sit_on_the_captured_layer_only_and_leave_with_the_block(dirs, ids) -> None:
    adapter = _load(dirs, "bloom")
    modules = [adapter.attention(layer) for layer in range(adapter.n_layers)]
    calls: list[int] = []
    with adapter.capture([0], want_bias=False) as cap:
        assert [bool(m._forward_hooks) for m in modules] == [True, False]
        assert not any(m._forward_pre_hooks for m in modules)  # no bias wanted, no pre-hook
        handle = adapter.model.h[1].register_forward_pre_hook(lambda *_: calls.append(1))
        adapter.forward(ids)
        handle.remove()
    assert set(cap.weights) == {0} and not cap.bias
    assert calls == []  # the pass ended after the captured layer's attention
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in modules)
    adapter.forward(ids)  # outside capture the whole model runs again


# ----------------------------------------------------------------------------------------- scores (docs/positional.md)


@pytest.mark.parametrize(("model_type", "qk"), [("bloom", _bloom_qk), ("mpt", _mpt_qk), ("falcon", _falcon_qk),
                                                ("t5", _t5_qk), ("gpt2", _gpt2_qk)])  # fmt: skip
def test_every_transformers_adapter_captures_the_scores_and_their_q_and_k(dirs, ids, model_type: str, qk) -> None:
    """The scores of the captured layer are the library's own scaled q·k (its modules, recomputed here) plus the
    bias the adapter captures, masked cells NaN; the call's q and k give the same product."""
    adapter = _load(dirs, model_type)
    assert adapter.captures_scores
    seen: dict[str, torch.Tensor] = {}
    attn = adapter.attention(LAYER)
    handle = attn.register_forward_hook(lambda mod, args, out: seen.__setitem__("qk", qk(mod, args[0])))
    try:
        with adapter.capture([LAYER], want_scores=True) as cap:
            adapter.forward(ids)
    finally:
        handle.remove()
    scores, bias = cap.scores[LAYER], cap.bias.get(LAYER)
    expected = seen["qk"] + (0.0 if bias is None else bias)
    kept = ~scores.isnan()
    if adapter.causal:
        assert bool((kept == torch.ones(T, T, dtype=torch.bool).tril()).all())
    torch.testing.assert_close(scores[kept], expected.expand_as(scores)[kept], atol=1e-5, rtol=1e-5)
    q, k, scale = cap.operands[LAYER]  # k multiplied by the call's scale, as the stream's blocks bring it
    assert scale > 0
    torch.testing.assert_close((q @ k.transpose(-1, -2))[kept], seen["qk"][kept], atol=1e-5, rtol=1e-5)
