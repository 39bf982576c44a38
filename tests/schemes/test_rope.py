"""The ``rope`` scheme against transformers' own rotary code (Llama; GPT-NeoX with partial rotary), and in our model."""

from __future__ import annotations

import pytest
import torch

from biasviz.common.errors import BiasvizError
from biasviz.schemes import SCHEMES, info
from tests.conftest import small_model

B, H, T, HD = 2, 4, 64, 16


def _qk() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return torch.randn(B, H, T, HD, generator=gen), torch.randn(B, H, T, HD, generator=gen)  # transformers' layout


def _ours(q: torch.Tensor, k: torch.Tensor, **options: float) -> tuple[torch.Tensor, torch.Tensor]:
    rope = SCHEMES["rope"](H, H * HD, **options)
    qr, kr = rope.rotate(q.transpose(1, 2), k.transpose(1, 2))  # ours take (B, T, H, hd)
    return qr.transpose(1, 2), kr.transpose(1, 2)


@pytest.mark.parametrize("base", [10000.0, 500000.0, 37.0])
def test_rope_equals_llamas_apply_rotary_pos_emb(base: float) -> None:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = LlamaConfig(hidden_size=H * HD, num_attention_heads=H, num_key_value_heads=H, rope_theta=base,
                         max_position_embeddings=T)  # fmt: skip
    q, k = _qk()
    cos, sin = LlamaRotaryEmbedding(config)(q, torch.arange(T)[None].expand(B, T))
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = _ours(q, k, base=base)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fraction", [0.25, 0.5, 1.0])
def test_partial_rope_equals_gpt_neoxs(fraction: float) -> None:
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding, apply_rotary_pos_emb

    config = GPTNeoXConfig(hidden_size=H * HD, num_attention_heads=H, rotary_pct=fraction, rotary_emb_base=1000,
                           max_position_embeddings=T)  # fmt: skip
    q, k = _qk()
    cos, sin = GPTNeoXRotaryEmbedding(config)(q, torch.arange(T)[None].expand(B, T))
    want_q, want_k = apply_rotary_pos_emb(q, k, cos, sin)
    got_q, got_k = _ours(q, k, base=1000.0, fraction=fraction)
    torch.testing.assert_close(got_q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_k, want_k, rtol=1e-5, atol=1e-5)
    rot = int(HD * fraction)
    assert torch.equal(got_q[..., rot:], q[..., rot:])  # the dimensions past d_rot pass unchanged


def test_scores_depend_on_i_minus_j_only() -> None:
    """<R_i q, R_j k> = <q, R_{j-i} k>: the same q and k at every position give a Toeplitz score matrix."""
    rope = SCHEMES["rope"](1, HD)
    q = torch.randn(1, 1, 1, HD, dtype=torch.float64).expand(1, T, 1, HD)
    k = torch.randn(1, 1, 1, HD, dtype=torch.float64).expand(1, T, 1, HD)
    qr, kr = rope.rotate(q, k)
    s = (qr[0, :, 0] @ kr[0, :, 0].T).numpy()
    for d in range(-T + 1, T):
        diag = s.diagonal(-d)
        assert abs(diag - diag[0]).max() < 1e-9


def test_the_model_rotates_q_and_k_before_hook_points_and_adds_no_bias() -> None:
    from biasviz.model import capture

    model = small_model("rope")
    assert info("rope").rotary and not info("rope").adds_bias
    ids = torch.randint(0, 97, (1, 12))
    got: dict[str, torch.Tensor] = {}
    names = ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_bias"]
    with capture(model, names, lambda t, n, _r: got.update({n: t})), torch.no_grad():
        full = model(ids).logits
    assert "blocks.0.attn.hook_bias" not in got
    attn = model.blocks[0].attn
    with torch.no_grad():
        x = model.blocks[0].ln_1(model.embed(ids))
        q, k, _ = attn.c_attn(x).split(x.shape[-1], dim=-1)
        q, k = (t.view(1, 12, attn.n_head, attn.head_dim) for t in (q, k))
        want_q, want_k = attn.pos_bias.rotate(q, k)
    torch.testing.assert_close(got["blocks.0.attn.hook_q"], want_q)
    torch.testing.assert_close(got["blocks.0.attn.hook_k"], want_k)
    torch.testing.assert_close(model(ids).logits.detach(), full, rtol=1e-5, atol=1e-5)  # training path agrees


@pytest.mark.parametrize("options", [{"fraction": 0.0}, {"fraction": 1.5}, {"base": -1}, {"base": "x"}])
def test_bad_rope_options_are_refused(options: dict) -> None:
    with pytest.raises(BiasvizError, match="rope"):
        SCHEMES["rope"].check_options(options, 12)
