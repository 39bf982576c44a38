"""GPT-OSS's eager attention, whose softmax runs over a learned sink column beside the keys, each row shifted by its
largest logit first, kept by a summary's forward (:func:`~biasviz.tracing.eager_kept.eager_operands`): each row's sink
logit goes into the bank beside q and k, and the rows are formed again with it in the softmax's denominator, rather than
streamed whole. The file is the one the rows streamed whole give, and the weights' mean and spread over samples are the
library's own ``output_attentions`` (the keys' part, float64 numpy), on a sliding layer and a global one."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.extraction.one_layer import assert_same_datasets, both_ways
from tests.summaries.test_attended_cells import HEADS, KV_HEADS, VOCAB, WINDOW, N, T


def gpt_oss(layers: int, sink_std: float = 2.0) -> Any:
    """A tiny GPT-OSS (eager attention, a sliding window of WINDOW keys in its first layer, then global), its learned
    sinks drawn with spread ``sink_std`` (2: sinks that take a real share of the softmax)."""
    from transformers import GptOssConfig, GptOssForCausalLM

    torch.manual_seed(0)
    config = GptOssConfig(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=8,
                          num_hidden_layers=layers, intermediate_size=32, vocab_size=VOCAB, num_local_experts=2,
                          num_experts_per_tok=1, sliding_window=WINDOW, max_position_embeddings=64,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                          attn_implementation="eager")  # fmt: skip
    model = GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_(std=sink_std)
    return model


@pytest.fixture(scope="module", params=[(1, 1), (1, N), (2, N)],
                ids=lambda p: f"{'sliding' if p[0] == 1 else 'global'} layer, batch {p[1]}")  # fmt: skip
def summarised(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    layers, batch = request.param
    model = gpt_oss(layers)
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(7))
    got = both_ways(model, ids, tmp_path_factory.mktemp("sinks"), batch, T)
    with torch.no_grad():
        weights = model(ids, output_attentions=True).attentions[-1].double().numpy()  # the last layer's
    return {**got, "weights": weights}


def test_the_rows_are_formed_again_and_nothing_is_streamed(summarised: dict[str, Any]) -> None:
    assert not summarised["went_streamed"]
    assert not [w for w in summarised["said"] if "started again" in w], summarised["said"]


def test_the_weights_are_the_model_s_own_beside_its_sink(summarised: dict[str, Any]) -> None:
    """The keys' weights sum to less than 1 in a row (the sink takes the rest); their mean and spread over samples, over
    the attended cells, as the library's own."""
    w, stored = summarised["weights"], summarised["stored"]
    assert (w.sum(-1) < 0.99).any()  # the sink takes a share
    attended = np.isfinite(stored["weights_mean"])
    np.testing.assert_allclose(stored["weights_mean"][attended], w.mean(0)[attended], rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(stored["weights_std"][attended], w.std(0)[attended], rtol=1e-4, atol=2e-6)
    assert np.array_equal(attended, np.broadcast_to(w.max(0) > 0, attended.shape))


def test_formed_again_as_the_rows_streamed_whole_give_it(summarised: dict[str, Any]) -> None:
    """Every dataset of the two ways in; formed again, the layer also gets its rotary measures (P by rotary pair), as
    the same model's SDPA calls get them (the streamed route has no q and k of an eager call's pairs)."""
    stored, streamed = summarised["stored"], summarised["streamed"]
    assert set(stored) - set(streamed) == {"positional_frequency", "positional_frequency_se"}
    assert_same_datasets({name: stored[name] for name in streamed}, streamed, atol=2e-6)


def test_formed_rows_with_sinks_are_a_softmax_over_the_keys_and_the_sink_together() -> None:
    """formed_rows(sinks=) against float64 numpy of a softmax over [the row's attended scores, its sink logit], the
    keys' part: a row with no key has weights 0, beside a finite sink or one of -inf."""
    from biasviz.tracing.calls import formed_rows

    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(1, 2, 5, 4)), rng.normal(size=(1, 2, 6, 4))
    kept = np.tril(np.ones((5, 6), bool), 1)[None, None].repeat(2, 1)
    kept[0, 1, 2] = False  # a row with no key
    sinks = rng.normal(size=(1, 2, 5))
    sinks[0, 1, 2] = -np.inf
    scores, weights = formed_rows(*(torch.from_numpy(x).float() for x in (q, k)), 0.5, torch.from_numpy(kept),
                                  sinks=torch.from_numpy(sinks).float())  # fmt: skip
    s = 0.5 * np.einsum("bhid,bhjd->bhij", q, k)
    z = np.concatenate([np.where(kept, s, -np.inf), sinks[..., None]], -1)
    top = np.nan_to_num(z.max(-1, keepdims=True), neginf=0.0)
    e = np.exp(z - top)
    want = (e / np.maximum(e.sum(-1, keepdims=True), 1e-300))[..., :-1]
    np.testing.assert_allclose(scores.numpy(), s, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(weights.numpy(), want, rtol=1e-5, atol=1e-7)
    assert not weights[0, 1, 2].any() and weights.sum(-1).max() < 1.0


def test_on_a_gpu_the_fused_kernels_take_the_sink_logits_the_bank_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused kernels form a softmax beside sink columns: the layer is theirs, and the sink logits they are handed
    are (N, T, H), each row's the model's learned sink of its head (tests/summaries/test_fused_layer_kept.py holds the
    file they write against the torch path's)."""
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.summaries.bank import SampleBank
    from biasviz.summaries.fused_layer import why_not

    model = gpt_oss(1)
    adapter = TracedAdapter(model)
    ids = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(7))
    adapter.prepare(ids.numpy(), -1)
    adapter.resolve_layers(-1)  # the calls a summary chooses
    bank = SampleBank(2, device=torch.device("cpu"))
    with torch.no_grad(), adapter.keep([0], bank):
        adapter.forward(ids)
    monkeypatch.setenv("BIASVIZ_STATISTICS", "fused")
    monkeypatch.setattr("biasviz.summaries.kernels.unavailable", lambda device: None)
    assert adapter.fused_rows and adapter.score_softcap(0) is None
    assert why_not(adapter, bank, 0, torch.device("cpu"), by_sample=False, mask=None, table=None, block=1) is None
    logits = adapter.sink_logits(0, bank)
    assert logits.shape == (2, T, HEADS)
    want = model.model.layers[0].self_attn.sinks.detach().float()
    torch.testing.assert_close(logits, want.expand(2, T, HEADS))
