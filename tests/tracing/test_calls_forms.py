"""Fused attention calls in every documented form: SDPA's 3-D inputs with a batched mask, calls that cannot be
formed, flex score_mods that mask by themselves or are not additive at any scale, and transformers' packed
grouped-query decoding. Each against float64 attention written out here or the library's own eager path."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

import biasviz
from tests.tracing.test_calls import reference

TOL = 1e-5


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a.double() - b.double()).abs() <= TOL).all())




def alibi(heads: int, t: int) -> torch.Tensor:
    slopes = torch.tensor([2.0 ** (-8.0 * h / heads) for h in range(1, heads + 1)], dtype=torch.float64)
    i = torch.arange(t, dtype=torch.float64)
    return -slopes[:, None, None] * (i[:, None] - i[None, :])


def test_sdpa_three_dim_inputs_with_a_batched_mask() -> None:
    """q, k, v of (N, L, E) with an (N, L, S) float mask: one head per sample, the mask's first dim is N."""
    g = torch.Generator().manual_seed(0)
    n, tq, tk, e = 3, 5, 7, 8
    q, k, v = torch.randn(n, tq, e, generator=g), torch.randn(n, tk, e, generator=g), torch.randn(n, tk, e, generator=g)
    bias = torch.randn(n, tq, tk, generator=g)
    mask = bias.clone()
    mask[1, :, 5:] = float("-inf")  # sample 1: its last two keys are padding
    with biasviz.trace() as t:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    kept = (mask > -1e9)[:, None]
    assert t.notes == {} and t.calls[0].batch == n and t.calls[0].heads == 1
    assert close(t.weights[0], reference(q[:, None], k[:, None], 1 / math.sqrt(e), bias[:, None], kept))
    assert torch.isnan(t.bias[0][~kept]).all() and close(t.bias[0][kept], bias[:, None][kept])


def test_a_call_that_cannot_be_formed_still_runs_and_says_why(monkeypatch) -> None:
    """Whatever goes wrong in forming a call (here: forming its scores fails), the model's call runs as it would."""
    from biasviz.tracing import calls

    def fails(*_: object) -> torch.Tensor:
        raise RuntimeError("out of memory forming the scores")

    monkeypatch.setattr(calls, "_scores", fails)
    q = k = v = torch.randn(2, 4, 6, 8)
    with biasviz.trace() as t:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert t.weights == {} and "out of memory forming the scores" in t.notes[0] and "ran unchanged" in t.notes[0]
    assert (t.calls[0].batch, t.calls[0].heads, t.calls[0].q_len, t.calls[0].k_len) == (2, 4, 6, 6)


# --- flex_attention -----------------------------------------------------------------------------------------
def _flex(score_mod, heads: int = 4, t_len: int = 24, e: int = 16):  # noqa: ANN001, ANN202
    from torch.nn.attention.flex_attention import flex_attention

    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, heads, t_len, e, generator=g) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex_attention's note that it runs unfused without torch.compile
        with biasviz.trace() as t:
            out = flex_attention(q, k, v, score_mod=score_mod)
        assert torch.equal(out, flex_attention(q, k, v, score_mod=score_mod))  # the call itself is untouched
    return t, q, k


@pytest.mark.parametrize("fill", [float("-inf"), torch.finfo(torch.float32).min])
def test_flex_score_mod_that_masks_by_itself(fill: float) -> None:
    slopes = torch.tensor([2.0 ** (-8.0 * h / 4) for h in range(1, 5)])

    def causal_alibi(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
        return torch.where(q_idx >= kv_idx, score - slopes[h] * (q_idx - kv_idx), fill)

    t, q, k = _flex(causal_alibi)
    kept = torch.ones(24, 24, dtype=torch.bool).tril()
    assert t.calls[0].causal and t.calls[0].adds_bias and t.notes == {}
    assert close(t.weights[0], reference(q, k, 1 / 4, alibi(4, 24), kept))
    bias = t.bias[0]
    assert torch.isnan(bias[..., ~kept]).all() and close(bias[..., kept], alibi(4, 24)[:, kept].expand(2, -1, -1))


@pytest.mark.parametrize("cap", [50.0, 1e4])
def test_a_softcap_is_never_taken_for_a_bias_whatever_the_scores(cap: float) -> None:
    """With a cap far above the scores the call sees, tanh is linear there; larger probes still show it."""

    def softcap(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202
        return cap * torch.tanh(score / cap)

    t, q, k = _flex(softcap)
    assert t.bias == {} and not t.calls[0].adds_bias and "not additive" in t.notes[0]
    s = (q.double() @ k.double().transpose(-2, -1)) / 4
    assert close(t.weights[0], torch.softmax(cap * torch.tanh(s / cap), dim=-1))


def tiny_llama(impl: str) -> torch.nn.Module:
    """Two layers, 4 query heads sharing 2 key heads, random weights (the same for every attention)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    torch.manual_seed(0)
    return LlamaForCausalLM._from_config(config, attn_implementation=impl).eval()


# --- transformers: batched cached decoding with grouped-query heads and left padding --------------------------
def test_llama_packed_gqa_decoding_reports_the_models_heads() -> None:
    """transformers packs q as (batch, KV heads, repeats * queries, dim) to decode one token with GQA and a
    mask; the trace reports (batch, heads, 1, keys) and equals eager ``output_attentions`` of the same step."""
    from transformers import DynamicCache

    sdpa, eager = tiny_llama("sdpa"), tiny_llama("eager")
    eager.load_state_dict(sdpa.state_dict())
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(0))
    pad = torch.ones(2, 9, dtype=torch.long)
    pad[1, :3] = 0  # sample 1 is left-padded by 3
    step = torch.tensor([[5], [7]])
    pad_step = torch.cat([pad, torch.ones(2, 1, dtype=torch.long)], dim=1)

    def decode(model: torch.nn.Module, traced: bool) -> tuple[torch.Tensor, object, object]:
        with torch.no_grad():
            cache = DynamicCache(config=model.config)
            model(ids, attention_mask=pad, past_key_values=cache, use_cache=True)
            if not traced:
                out = model(step, attention_mask=pad_step, past_key_values=cache, use_cache=True,
                            output_attentions=model is eager)  # fmt: skip
                return out.logits, out.attentions, None
            with biasviz.trace(model) as t:
                out = model(step, attention_mask=pad_step, past_key_values=cache, use_cache=True)
            return out.logits, None, t

    logits, _, t = decode(sdpa, traced=True)
    assert torch.equal(logits, decode(sdpa, traced=False)[0])  # bit for bit: the calls ran unchanged
    _, expected, _ = decode(eager, traced=False)
    assert len(t.calls) == 2
    for layer in range(2):
        call = t.calls[layer]
        assert (call.batch, call.heads, call.q_len, call.k_len) == (2, 4, 1, 10)
        assert close(t.weights[layer], expected[layer])
        assert (t.weights[layer][1, :, :, :3] == 0).all()  # the left padding


def test_transformers_flex_path_mask_added_by_its_score_mod_is_a_mask() -> None:
    """transformers' flex path adds its padding mask (0 or finfo.min) in a score_mod: a mask, not a bias."""

    flex, eager = tiny_llama("flex_attention"), tiny_llama("eager")
    eager.load_state_dict(flex.state_dict())
    ids = torch.randint(0, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    pad = torch.ones(2, 12, dtype=torch.long)
    pad[1, :3] = 0
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with biasviz.trace(flex) as t:
            traced = flex(ids, attention_mask=pad).logits
        # transformers compiles its flex call; traced, it runs eagerly: equal to float32 rounding
        assert torch.allclose(traced, flex(ids, attention_mask=pad).logits, atol=TOL, rtol=0)
        expected = eager(ids, attention_mask=pad, output_attentions=True).attentions
    assert t.bias == {} and t.notes == {} and [c.kind for c in t.calls] == ["flex_attention"] * 2
    for layer in range(2):
        assert t.calls[layer].causal and not t.calls[layer].adds_bias
        assert close(t.weights[layer][0], expected[layer][0])
        assert close(t.weights[layer][1, :, 3:], expected[layer][1, :, 3:])  # padded queries: all masked, 0 here
