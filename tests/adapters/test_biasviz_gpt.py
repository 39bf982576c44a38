"""biasviz's own models streamed in blocks of query rows (:mod:`biasviz.adapters.biasviz_gpt`)."""

from __future__ import annotations

import pytest
import torch

from tests.adapters.test_adapters import T, _assemble, _kinds, ids
from tests.conftest import small_model


@pytest.mark.parametrize("scheme", ["alibi", "cable", "nope"])
def test_biasgpt_stream_blocks_reassemble_to_what_capture_assembles(scheme, monkeypatch):
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
    from biasviz.extraction.full_matrices import full_matrices
    from biasviz.model.modeling import Attention

    adapter = BiasGPTAdapter(small_model(scheme), source="t")
    x = torch.as_tensor(ids(2))  # (2, T)
    with full_matrices(adapter, [0, 1]) as got:  # a single block at this length: what the model formed, as it is
        adapter.forward(x)
    whole = {**{(k, "bias"): v for k, v in got.bias.items()}, **{(k, "weights"): v for k, v in got.weights.items()}}
    monkeypatch.setattr(Attention, "block_elements", 24 * 60)  # now each matrix comes in many blocks
    with full_matrices(adapter, [0, 1]) as got:
        adapter.forward(x)
    sent: list[tuple[int, str, int, torch.Tensor]] = []
    with adapter.stream([0, 1], True, lambda b: sent.extend(_kinds(b))):
        adapter.forward(x)
    assert len(sent) > 2 * (2 if scheme == "nope" else 4)
    assert all(t.shape[-2] < T for *_, t in sent)  # never a whole matrix
    streamed = _assemble(sent, T)
    kinds = ["weights"] if scheme == "nope" else ["bias", "weights"]
    assert set(streamed) == {(layer, kind) for layer in (0, 1) for kind in kinds} == set(whole)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for (layer, kind), t in streamed.items():
        captured = (got.bias if kind == "bias" else got.weights)[layer]
        assert captured.shape == t.shape == whole[layer, kind].shape  # (1 or B, H, T, T)
        torch.testing.assert_close(captured, t, rtol=0, atol=0, equal_nan=True)  # assembled from the same blocks
        # layer 1's input differs from the one-block run's by rounding (the blocks of layer 0 summed differently)
        torch.testing.assert_close(t[..., causal], whole[layer, kind][..., causal], rtol=1e-5, atol=1e-5)
        if kind == "bias":  # cells past a block's keys, which no block formed, are NaN; the rest is the bias
            above, want = t[..., ~causal], whole[layer, kind][..., ~causal]
            assert above.isnan().any()
            torch.testing.assert_close(torch.where(above.isnan(), want, above), want, rtol=1e-5, atol=1e-5)
        else:
            assert (t[..., ~causal] == 0).all()


def test_biasgpt_stream_stops_after_the_last_requested_layer():
    from biasviz.adapters.biasviz_gpt import BiasGPTAdapter

    adapter = BiasGPTAdapter(small_model("alibi"), source="t")
    ran: list[str] = []
    adapter.model.blocks[1].attn.register_forward_hook(lambda *_: ran.append("layer 1"))
    adapter.model.lm_head.register_forward_hook(lambda *_: ran.append("lm_head"))
    sent: list[tuple[int, str, int]] = []
    with adapter.stream([0], False, lambda b: sent.extend(x[:3] for x in _kinds(b))):
        adapter.forward(torch.as_tensor(ids(1)))
    assert ran == [] and sent == [(0, "weights", 0)]  # no bias asked for; nothing after layer 0 ran
    adapter.forward(torch.as_tensor(ids(1)))
    assert ran == ["layer 1", "lm_head"]  # the hooks and the stop are gone with the block
