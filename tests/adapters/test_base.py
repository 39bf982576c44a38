"""What every adapter inherits (:mod:`biasviz.adapters.base`): the default stream, on top of capture."""

from __future__ import annotations

import torch

from biasviz.adapters import ModelAdapter, load_model
from tests.adapters.test_adapters import C, H, L, T, V, _kinds, ids


def test_default_stream_sends_what_capture_holds(tmp_path):
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    BloomForCausalLM(BloomConfig(vocab_size=V, hidden_size=C, n_layer=L, n_head=H)).save_pretrained(tmp_path / "b")
    adapter = load_model(tmp_path / "b")
    assert type(adapter).stream is ModelAdapter.stream  # the default, on top of capture
    x = torch.as_tensor(ids(2))
    with adapter.capture([0, 1]) as got:
        adapter.forward(x)
    want = {**{(k, "bias"): v.clone() for k, v in got.bias.items()},
            **{(k, "weights"): v.clone() for k, v in got.weights.items()}}  # fmt: skip
    sent: list[tuple[int, str, int, torch.Tensor]] = []
    with adapter.stream([0, 1], True, lambda b: sent.extend(_kinds(b))) as flush:
        adapter.forward(x)
        assert sent == []  # nothing until the caller flushes
        flush()
        assert [(layer, kind, row0) for layer, kind, row0, _ in sent] == [
            (0, "attended", 0), (0, "bias", 0), (0, "weights", 0),
            (1, "attended", 0), (1, "bias", 0), (1, "weights", 0)]  # fmt: skip
        flush()
        assert len(sent) == 6  # flush cleared what it sent
    assert set(want) == {(layer, kind) for layer, kind, _, _ in sent if kind != "attended"}
    for layer, kind, _, t in sent:
        assert t.shape[-2:] == (T, T)  # one block: the whole matrix
        # first the cells the call attended to (docs/hdf5.md, 'Attended cells'): where its bias is a number
        expected = torch.isfinite(want[layer, "bias"]) if kind == "attended" else want[layer, kind]
        assert torch.equal(t, expected)
    weights_only: list[str] = []
    with adapter.stream([1], False, lambda b: weights_only.extend(x[1] for x in _kinds(b))) as flush:
        adapter.forward(x)
        flush()
    assert weights_only == ["weights"]
