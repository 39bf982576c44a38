"""torch's own attention layers, traced: nn.MultiheadAttention (batch_first or not) and nn.Transformer*Layer.

Weights against torch's own ``need_weights=True, average_attn_weights=False`` and a float64 recomputation
from the layer's projection weights; the float ``attn_mask`` as the bias; the model's outputs unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch

import biasviz

TOL = 1e-5
E, H, L = 32, 4, 7


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(((a.double() - b.double()).abs() <= TOL).all())


def alibi_mask(t: int) -> torch.Tensor:
    i = torch.arange(t, dtype=torch.float32)
    return -0.5 * (i[:, None] - i[None, :]).abs()


def float64_mha(mha: torch.nn.MultiheadAttention, x: torch.Tensor, added: torch.Tensor) -> torch.Tensor:
    """Per-head weights of self-attention on x (N, L, E), written out in float64 from the packed projection."""
    w, b = mha.in_proj_weight.double(), mha.in_proj_bias.double()
    q, k, _ = (x.double() @ w.T + b).split(E, dim=-1)
    n = x.shape[0]
    q, k = (z.view(n, L, H, E // H).transpose(1, 2) for z in (q, k))
    s = q @ k.transpose(-2, -1) / math.sqrt(E // H) + added.double()
    return torch.softmax(s, dim=-1)


def own_weights(module: torch.nn.MultiheadAttention, seen: list) -> list[torch.Tensor]:  # noqa: ANN001
    """torch's reference: each call's inputs again, with need_weights=True, average_attn_weights=False."""
    with torch.no_grad():
        return [module(*a, **dict(kw, need_weights=True, average_attn_weights=False))[1] for a, kw in seen]


def record_inputs(module: torch.nn.Module) -> list:
    seen: list = []
    module.register_forward_pre_hook(lambda _m, a, kw: seen.append((a, kw)), with_kwargs=True)
    return seen


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")
@pytest.mark.parametrize("batch_first", [True, False])
def test_multihead_attention_weights_bias_and_padding(batch_first: bool) -> None:
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, H, batch_first=batch_first).eval()
    x = torch.randn(2, L, E)
    padding = torch.zeros(2, L, dtype=torch.bool)
    padding[1, -2:] = True  # sample 1: its last two keys are padding
    inp = x if batch_first else x.transpose(0, 1)
    kwargs = {"attn_mask": alibi_mask(L), "key_padding_mask": padding, "need_weights": False}
    seen = record_inputs(mha)
    with biasviz.trace(mha) as t:
        out = mha(inp, inp, inp, **kwargs)[0]
    assert torch.equal(out, mha(inp, inp, inp, **kwargs)[0])  # bit for bit: the call ran unchanged
    call = t.calls[0]
    assert (call.kind, call.batch, call.heads, call.q_len, call.k_len) == ("multi_head_attention", 2, H, L, L)
    assert close(t.weights[0], own_weights(mha, seen[:1])[0])
    kept = ~padding[:, None, None, :].expand(2, H, L, L)
    added = alibi_mask(L).masked_fill(~kept, float("-inf"))
    assert close(t.weights[0], float64_mha(mha, x, added))
    bias = t.bias[0].expand(2, H, L, L)
    assert torch.isnan(bias[~kept]).all() and close(bias[kept], alibi_mask(L).expand(2, H, L, L)[kept])


def test_a_boolean_mask_is_a_mask_and_per_head_float_masks_are_biases() -> None:
    torch.manual_seed(1)
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.randn(2, L, E)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L, dtype=torch.bool)  # True: not allowed
    per_head = torch.randn(2 * H, L, L)
    with biasviz.trace() as t:
        mha(x, x, x, attn_mask=causal, need_weights=False)
        mha(x, x, x, attn_mask=per_head)  # need_weights=True, averaged: the trace still has every head
    assert t.calls[0].causal and not t.calls[0].adds_bias and 0 not in t.bias
    assert close(t.weights[0], float64_mha(mha, x, torch.zeros(L, L).masked_fill(causal, float("-inf"))))
    assert t.calls[1].adds_bias and close(t.bias[1], per_head.view(2, H, L, L))
    assert close(t.weights[1], float64_mha(mha, x, per_head.view(2, H, L, L)))


def test_transformer_encoder_and_decoder_layers() -> None:
    torch.manual_seed(2)
    enc = torch.nn.TransformerEncoderLayer(E, H, 64, dropout=0.1, batch_first=True).eval()
    dec = torch.nn.TransformerDecoderLayer(E, H, 64, dropout=0.1, batch_first=True).eval()
    src, tgt = torch.randn(2, 9, E), torch.randn(2, L, E)
    causal = torch.nn.Transformer.generate_square_subsequent_mask(L)  # float: 0 and -inf
    seen = record_inputs(enc.self_attn)
    seen_self, seen_cross = record_inputs(dec.self_attn), record_inputs(dec.multihead_attn)

    def run() -> torch.Tensor:
        memory = enc(src, src_mask=alibi_mask(9))
        return dec(tgt, memory, tgt_mask=causal, tgt_is_causal=True)

    with biasviz.trace() as t:
        out = run()
    assert torch.equal(out, run())  # grad enabled: no fast path either way, so bit for bit
    assert [(c.q_len, c.k_len) for c in t.calls] == [(9, 9), (L, L), (L, 9)]
    assert close(t.weights[0], own_weights(enc.self_attn, seen[:1])[0]) and close(t.bias[0][0, 0], alibi_mask(9))
    assert close(t.weights[1], own_weights(dec.self_attn, seen_self[:1])[0]) and t.calls[1].causal
    assert 1 not in t.bias  # a causal mask of 0 and -inf is a mask, not a bias
    assert close(t.weights[2], own_weights(dec.multihead_attn, seen_cross[:1])[0]) and 2 not in t.bias


def test_inference_fast_path_is_left_for_the_traced_path_with_equal_outputs() -> None:
    """Under no_grad torch's layers take a fused fast path, which any function mode turns off: the traced
    forward takes the ordinary path, whose outputs agree with the fast path's to float32 rounding."""
    torch.manual_seed(3)
    enc = torch.nn.TransformerEncoderLayer(E, H, 64, batch_first=True).eval()
    x = torch.randn(2, L, E)
    with torch.no_grad():
        fast = enc(x)
        with biasviz.trace() as t:
            traced = enc(x)
    assert torch.allclose(fast, traced, atol=TOL) and t.weights[0].shape == (2, H, L, L)


@pytest.mark.parametrize("form", ["batch_first", "sequence_first", "unbatched", "bias_kv_zero_attn"])
def test_multihead_attention_scores_and_its_own_q_and_k(form: str) -> None:
    """With the scores, a layer's call keeps the softmax's input and the q and k its in-projection makes:
    against float64 from the packed weights, extra keys (``bias_k``, ``add_zero_attn``) appended as torch does."""
    from biasviz.tracing.mode import Trace

    torch.manual_seed(3)
    extra = form == "bias_kv_zero_attn"
    mha = torch.nn.MultiheadAttention(E, H, batch_first=form != "sequence_first", add_bias_kv=extra,
                                      add_zero_attn=extra).eval()  # fmt: skip
    x = torch.randn(2, L, E)
    inp = {"sequence_first": x.transpose(0, 1), "unbatched": x[0]}.get(form, x)
    with torch.no_grad(), Trace(mha, scores=True) as t:
        mha(inp, inp, inp, attn_mask=alibi_mask(L), need_weights=False)
    w, b = mha.in_proj_weight.double(), mha.in_proj_bias.double()
    q, k, _ = (x.double() @ w.T + b).split(E, dim=-1)
    n = 1 if form == "unbatched" else 2
    q, k = (z[:n].view(n, L, H, E // H).transpose(1, 2) for z in (q, k))
    added = alibi_mask(L).double()
    if extra:  # the learned key, then a zero key: both see every query, their mask column 0
        k = torch.cat([k, mha.bias_k.double().view(1, H, 1, E // H).expand(n, -1, -1, -1),
                       torch.zeros(n, H, 1, E // H, dtype=torch.float64)], dim=2)  # fmt: skip
        added = torch.nn.functional.pad(added, (0, 2))
    call = t.calls[0]
    assert close(call.q, q) and close(call.k, k) and call.scale == pytest.approx(1 / math.sqrt(E // H))
    assert close(t.scores[0], q @ k.transpose(-2, -1) / math.sqrt(E // H) + added)
