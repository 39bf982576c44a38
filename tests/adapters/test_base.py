"""What every adapter inherits (:mod:`biasviz.adapters.base`): the whole calls of adapters whose hooks see each call's
matrix, sent by :meth:`stream` once a forward is done."""

from __future__ import annotations

import torch

from biasviz.adapters import load_model
from tests.adapters.test_adapters import C, H, L, T, V, _kinds, ids


def test_whole_calls_go_as_one_block_each_once_the_forward_is_done(tmp_path):
    """Bloom's hooks see each layer's whole matrix: one block per layer, sent as the forward returns, its weights those
    of transformers' own ``output_attentions`` (as formed, masked cells included) and its bias marking the cells."""
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    BloomForCausalLM(BloomConfig(vocab_size=V, hidden_size=C, n_layer=L, n_head=H)).save_pretrained(tmp_path / "b")
    adapter = load_model(tmp_path / "b")
    x = torch.as_tensor(ids(2))
    with torch.no_grad():
        reference = adapter.model(input_ids=x, output_attentions=True, use_cache=False).attentions
    sent: list[tuple[int, str, int, torch.Tensor]] = []
    with adapter.stream([0, 1], True, lambda b: sent.extend(_kinds(b))):
        adapter.forward(x)
        assert [(layer, kind, row0) for layer, kind, row0, _ in sent] == [
            (0, "marked", 0), (0, "bias", 0), (0, "weights", 0),
            (1, "marked", 0), (1, "bias", 0), (1, "weights", 0)]  # fmt: skip
        adapter.forward(x)
        assert len(sent) == 12  # nothing of the first forward held over
    for layer, kind, _, t in sent[:6]:
        assert t.shape[-2:] == (T, T)  # one block: the whole matrix
        if kind == "weights":
            torch.testing.assert_close(t, reference[layer], rtol=1e-6, atol=1e-7)
    marked, bias = sent[0][3], sent[1][3]
    assert marked is bias and torch.isfinite(bias[..., torch.ones(T, T, dtype=torch.bool).tril()]).all()
    weights_only: list[str] = []
    with adapter.stream([1], False, lambda b: weights_only.extend(x[1] for x in _kinds(b))):
        adapter.forward(x)
    assert weights_only == ["weights"]
