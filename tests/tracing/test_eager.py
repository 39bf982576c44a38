"""Attention written out in eager PyTorch, traced by following q.kᵀ to its softmax: transformers' eager paths
(Llama with padding, Gemma2 softcapping, GPT-OSS attention sinks, BERT), x-transformers without flash
(relative, dynamic and ALiBi position biases), and attention written out here, each against its own reference
(``output_attentions``, ``return_attn``, the library's bias module, float64), with the logits unchanged."""

from __future__ import annotations

import math
import warnings

import h5py
import pytest
import torch

import biasviz

TOL = 1e-5


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a.double() - b.double()).abs() <= TOL).all())


def traced_and_reference(model: torch.nn.Module, ids: torch.Tensor, **kwargs: object):  # noqa: ANN201
    """The traced forward, the same forward untraced (its logits must be identical) and output_attentions."""
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with biasviz.trace(model) as t:
            traced = model(ids, **kwargs).logits
        assert torch.equal(traced, model(ids, **kwargs).logits)  # bit for bit: every operation ran as written
        return t, model(ids, output_attentions=True, **kwargs).attentions


def small(config_cls, model_cls, **extra):  # noqa: ANN001, ANN003, ANN201
    config = config_cls(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, **extra)  # fmt: skip
    torch.manual_seed(0)
    return model_cls._from_config(config, attn_implementation="eager").eval()


IDS = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
LEFT_PADDED = torch.ones(2, 12, dtype=torch.long)
LEFT_PADDED[1, :3] = 0  # sample 1 is left-padded by 3


def test_llama_eager_with_left_padding_and_grouped_query_heads() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    t, expected = traced_and_reference(small(LlamaConfig, LlamaForCausalLM), IDS, attention_mask=LEFT_PADDED)
    assert [c.kind for c in t.calls] == ["eager", "eager"] and t.bias == {} and t.notes == {}
    for layer in range(2):
        assert t.calls[layer].causal and close(t.weights[layer], expected[layer])
    assert (t.weights[0][1, :, 3:, :3] == 0).all()  # the padding (padded queries attend as the model has them)


def test_gemma2_softcapping_is_noted_never_a_bias() -> None:
    from transformers import Gemma2Config, Gemma2ForCausalLM

    model = small(Gemma2Config, Gemma2ForCausalLM, head_dim=16, attn_logit_softcapping=50.0, sliding_window=4)
    t, expected = traced_and_reference(model, IDS)
    assert t.bias == {} and all("softcapping (tanh)" in t.notes[layer] for layer in range(2))
    for layer in range(2):
        assert close(t.weights[layer], expected[layer]) and not t.calls[layer].adds_bias
    assert (t.weights[0][..., 8, :4] == 0).all() and (t.weights[0][..., 8, 5:9] > 0).all()  # the sliding window


def test_gpt_oss_attention_sinks() -> None:
    """Weights over the real keys (as GPT-OSS returns them) and the sink's share of each query, per head."""
    from transformers import GptOssConfig, GptOssForCausalLM

    model = small(GptOssConfig, GptOssForCausalLM, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                  sliding_window=4)  # fmt: skip
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.sinks.normal_()  # initialised to 0; a share per head that differs
    t, expected = traced_and_reference(model, IDS)
    for layer in range(2):
        assert close(t.weights[layer], expected[layer])
        assert close(t.sinks[layer], 1.0 - expected[layer].double().sum(-1))
        assert t.sinks[layer].shape == (2, 4, 12) and t.sinks[layer].std() > 0


def traced_encoder(model: torch.nn.Module, padding: torch.Tensor) -> tuple[object, tuple[torch.Tensor, ...]]:
    """An encoder's trace on IDS with ``padding``, and its own ``output_attentions``; the hidden states must be
    those of the untraced model, bit for bit."""
    with torch.no_grad():
        with biasviz.trace(model) as t:
            traced = model(IDS, attention_mask=padding).last_hidden_state
        assert torch.equal(traced, model(IDS, attention_mask=padding).last_hidden_state)
        expected = model(IDS, attention_mask=padding, output_attentions=True).attentions
    return t, expected


def test_bert_eager_with_padding_is_bidirectional() -> None:
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4)  # fmt: skip
    model = BertModel._from_config(config, attn_implementation="eager").eval()
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, -4:] = 0
    t, expected = traced_encoder(model, padding)
    for layer in range(2):
        assert close(t.weights[layer], expected[layer]) and not t.calls[layer].causal
    assert t.bias == {} and (t.weights[0][1, ..., -4:] == 0).all()


# --- x-transformers without flash --------------------------------------------------------------------------
@pytest.mark.parametrize("position", ["rel_pos_bias", "dynamic_pos_bias", "alibi_pos_bias"])
def test_x_transformers_eager_position_biases(position: str) -> None:
    xt = pytest.importorskip("x_transformers")
    torch.manual_seed(0)
    layers = xt.Decoder(dim=64, depth=2, heads=4, attn_flash=False, **{position: True})
    model = xt.TransformerWrapper(num_tokens=100, max_seq_len=32, attn_layers=layers).eval()
    ids = torch.randint(0, 100, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with biasviz.trace(model) as t:
            traced = model(ids)
        assert torch.equal(traced, model(ids))
        _, maps = model(ids, return_attn=True)  # x-transformers' own post-softmax attention
        own_bias = model.attn_layers.rel_pos(20, 20).double()  # the library's bias module, (H, T, T)
    kept = torch.ones(20, 20, dtype=torch.bool).tril()
    assert len(t.calls) == 2 and t.notes == {}
    for layer in range(2):
        assert t.calls[layer].kind == "eager" and t.calls[layer].causal and close(t.weights[layer], maps[layer])
        bias = t.bias[layer].expand(2, 4, 20, 20)
        assert torch.isnan(bias[..., ~kept]).all()
        assert close(bias[..., kept], own_bias[..., kept].expand(2, -1, -1))


def test_x_transformers_eager_alibi_extracts_with_its_bias(tmp_path) -> None:
    xt = pytest.importorskip("x_transformers")
    torch.manual_seed(0)
    layers = xt.Decoder(dim=64, depth=2, heads=4, attn_flash=False, alibi_pos_bias=True)
    model = xt.TransformerWrapper(num_tokens=100, max_seq_len=32, attn_layers=layers).eval()
    ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    result = biasviz.extract(model, ids, tmp_path / "x.h5", layers=-1, device="cpu", progress=False)
    with torch.no_grad():
        _, maps = model(ids, return_attn=True)
    assert result.has_bias and result.layers == [1]
    with h5py.File(tmp_path / "x.h5") as f:
        assert close(torch.from_numpy(f["layer_1/weights"][:]), maps[1])


# --- attention written out here -----------------------------------------------------------------------------
def test_hand_written_eager_attention_against_float64() -> None:
    """einsum, a scale, an additive bias, -inf masking, a per-row shift; a matmul with a weight is no call."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 10, 8, generator=g) for _ in range(3))
    bias = torch.randn(3, 10, 10, generator=g)
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    head = torch.nn.Parameter(torch.randn(8, 8, generator=g))

    def attention(x: torch.Tensor) -> torch.Tensor:
        s = torch.einsum("bhid,bhjd->bhij", x, k) / math.sqrt(8)
        s = (s + bias).masked_fill(~causal, float("-inf"))
        s = s - s.amax(dim=-1, keepdim=True)  # the softmax cannot see a per-row constant
        w = s.softmax(dim=-1)
        return torch.softmax((w @ v) @ head, dim=-1)  # a product with a parameter, softmaxed: not attention

    with biasviz.trace(layers=[0], stop=False) as t:
        out = attention(q)
    assert torch.equal(out, attention(q)) and len(t.calls) == 1
    expected = torch.softmax(((q.double() @ k.double().transpose(-2, -1)) / math.sqrt(8) + bias.double())
                             .masked_fill(~causal, float("-inf")), dim=-1)  # fmt: skip
    assert close(t.weights[0], expected)
    assert torch.isnan(t.bias[0][..., ~causal]).all()
    # the same for both samples: stored once (1, H, T, T), as SDPA reports a bias given to it broadcast
    assert close(t.bias[0][..., causal], bias[:, causal][None])


def test_x_transformers_learned_head_sink() -> None:
    """x-transformers puts its sink column first; its return_attn keeps it: weights are the rest, sinks the first."""
    xt = pytest.importorskip("x_transformers")
    torch.manual_seed(0)
    layers = xt.Decoder(dim=64, depth=2, heads=4, attn_flash=False, alibi_pos_bias=True, attn_head_learned_sink=True)
    model = xt.TransformerWrapper(num_tokens=100, max_seq_len=32, attn_layers=layers).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1 and p.shape == (4,):
                p.normal_()  # the sinks start at 0
        ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
        with biasviz.trace(model) as t:
            traced = model(ids)
        assert torch.equal(traced, model(ids))
        _, maps = model(ids, return_attn=True)  # (B, H, T, 1 + T): the sink column first
    for layer in range(2):
        assert close(t.weights[layer], maps[layer][..., 1:]) and close(t.sinks[layer], maps[layer][..., 0])
        assert t.calls[layer].causal and layer in t.bias


def test_llama_eager_cached_decoding_with_padding() -> None:
    """One token decoded against a cache of 9, grouped-query heads, sample 1 left-padded: (2, 4, 1, 10)."""
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    model = small(LlamaConfig, LlamaForCausalLM)
    ids, step = IDS[:, :9], torch.tensor([[5], [7]])
    pad, pad_step = LEFT_PADDED[:, :9], LEFT_PADDED[:, :10]

    def decode(traced: bool, output_attentions: bool = False):  # noqa: ANN202
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(ids, attention_mask=pad, past_key_values=cache, use_cache=True)
            with biasviz.trace(model) if traced else torch.no_grad() as t:
                out = model(step, attention_mask=pad_step, past_key_values=cache, use_cache=True,
                            output_attentions=output_attentions)  # fmt: skip
        return out, t

    out, t = decode(traced=True)
    assert torch.equal(out.logits, decode(traced=False)[0].logits)
    expected = decode(traced=False, output_attentions=True)[0].attentions
    for layer in range(2):
        assert (t.calls[layer].heads, t.calls[layer].q_len, t.calls[layer].k_len) == (4, 1, 10)
        assert close(t.weights[layer], expected[layer]) and (t.weights[layer][1, ..., :3] == 0).all()


def test_t5_eager_relative_bias_against_its_own_compute_bias() -> None:
    """T5 adds its bucketed relative bias (and the padding mask) to unscaled q.kᵀ in place (``scores +=``)."""
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    config = T5Config(vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    model = T5EncoderModel._from_config(config, attn_implementation="eager").eval()
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[1, -3:] = 0
    t, expected = traced_encoder(model, padding)
    with torch.no_grad():
        own = model.encoder.block[0].layer[0].SelfAttention.compute_bias(12, 12)  # (1, H, T, T), shared by layers
    kept = padding.bool()[:, None, None, :].expand(2, 4, 12, 12)
    for layer in range(2):
        assert close(t.weights[layer], expected[layer]) and not t.calls[layer].causal
        bias = t.bias[layer]
        assert torch.isnan(bias[~kept]).all() and close(bias[kept], own.expand(2, -1, -1, -1)[kept])


def test_a_softcapped_transformers_directory_is_loaded_eager_and_traced(tmp_path) -> None:
    """Gemma2 with attention-logit softcapping has no SDPA path: ``--model DIR`` loads it eager and traces that."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    small(Gemma2Config, Gemma2ForCausalLM, head_dim=16, attn_logit_softcapping=50.0).save_pretrained(tmp_path / "g")
    reference = Gemma2ForCausalLM.from_pretrained(tmp_path / "g", attn_implementation="eager").eval()
    with torch.no_grad():
        expected = reference(IDS, output_attentions=True, use_cache=False).attentions
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = biasviz.extract(str(tmp_path / "g"), IDS, tmp_path / "g.h5", layers="all", device="cpu",
                                 progress=False)  # fmt: skip
    assert not result.has_bias and any("softcapping (tanh)" in str(w.message) for w in caught)
    with h5py.File(tmp_path / "g.h5") as f:
        assert "layer_0/bias" not in f
        for layer in range(2):
            assert close(torch.from_numpy(f[f"layer_{layer}/weights"][:]), expected[layer])


def test_x_transformers_softclamped_logits_are_traced_with_a_note() -> None:
    """x-transformers' softclamp is a TorchScript function, which no torch function mode sees: the call is still
    reported, with the library's own weights and a note saying why it has no bias (before: no call at all)."""
    xt = pytest.importorskip("x_transformers")
    torch.manual_seed(0)
    layers = xt.Decoder(dim=32, depth=2, heads=2, attn_flash=False, attn_softclamp_logits=True,
                        attn_logit_softclamp_value=5.0)  # fmt: skip
    model = xt.TransformerWrapper(num_tokens=50, max_seq_len=32, attn_layers=layers).eval()
    ids = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with biasviz.trace(model) as t:
            model(ids)
        _, maps = model(ids, return_attn=True)  # x-transformers' own post-softmax attention
    assert len(t.calls) == 2 and t.bias == {}
    for layer in range(2):
        assert "cannot see" in t.notes[layer] and close(t.weights[layer], maps[layer])


class _Hybrid(torch.nn.Module):
    """A hybrid layer stack: a linear attention (products of activations whose cells are moved, no softmax), whose
    output flows on through the residual stream into an MoE router's softmax, then a real SDPA attention."""

    def __init__(self, d: int = 16, heads: int = 2, experts: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.qk, self.mix, self.router = (torch.nn.Linear(d, d), torch.nn.Linear(8, d),
                                          torch.nn.Linear(d, experts))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q = self.qk(x).view(b, t, self.heads, d // self.heads).transpose(1, 2)
        decayed = torch.roll(q @ q.transpose(-1, -2), 1, -1)  # a linear attention's product, its cells moved
        x = x + self.mix(decayed.mean(1)[..., :8])  # into the residual stream: no attention's scores any more
        gate = torch.softmax(self.router(x), dim=-1)  # an MoE router: a softmax over experts, not keys
        x = x * gate.sum(-1, keepdim=True)
        q = x.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        return x + torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).transpose(1, 2).reshape(
            b, t, d)


def test_a_linear_attention_s_moved_products_do_not_make_a_router_an_attention_call() -> None:
    """Qwen3-Next's shape: its gated delta rule's products reach every later layer through the residual stream; the
    router's softmax of each MoE layer was traced as an attention call (of 1 head, over the experts). A moved product
    is followed only through steps that move, reshape or scale its cells, so the one call is the SDPA call."""
    torch.manual_seed(0)
    model = _Hybrid().eval()
    with torch.no_grad(), biasviz.trace(model) as t:
        model(torch.randn(1, 12, 16))
    assert [(c.kind, c.heads, c.q_len, c.k_len) for c in t.calls] == [("sdpa", 2, 12, 12)]
