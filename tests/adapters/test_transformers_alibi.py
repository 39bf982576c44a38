"""transformers' ALiBi models (:mod:`biasviz.adapters.transformers_alibi`): BLOOM, MPT and Falcon against the
libraries' own numbers, and a rotary Falcon traced like any RoPE model.

Every model is a tiny random one built from its config class and saved to a temporary directory
(tests/adapters/tiny_transformers.py). Three checks per architecture: the captured bias equals the library's own
bias function; the captured weights equal the library's ``output_attentions`` under eager attention; and
softmax(q.k scaled + captured bias + causal mask), with q and k taken from the layer's own projections, gives those
weights back, so the bias is exactly the term the model added.
"""

from __future__ import annotations

import math

import torch

from biasviz.adapters.base import KEY_POSITION
from biasviz.adapters.transformers_alibi import FalconAdapter, load_falcon
from biasviz.schemes.alibi import interleaved_slopes
from tests.adapters import tiny_transformers
from tests.adapters.tiny_transformers import (
    LAYER,
    B,
    H,
    T,
    _assert_formed_as_the_model_forms_them,
    _assert_row_constant_shift,
    _assert_weights,
    _bloom_qk,
    _capture,
    _causal_softmax,
    _falcon_qk,
    _load,
    _mpt_qk,
)

dirs, ids = tiny_transformers.dirs, tiny_transformers.ids  # the saved models and the ids, fixtures of this file's own


# --------------------------------------------------------------------------------------------------- BLOOM


def test_bloom_bias_is_build_alibi_tensor_and_weights_are_output_attentions(dirs, ids) -> None:
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    adapter = _load(dirs, "bloom")
    assert (adapter.scheme, adapter.architecture, adapter.bias_convention) == ("alibi", "bloom", KEY_POSITION)
    assert (adapter.n_layers, adapter.n_heads, adapter.max_length, adapter.causal) == (2, H, None, True)
    bias, weights, scores = _capture(adapter, ids, _bloom_qk)
    assert bias.shape == weights.shape == (B, H, T, T)

    library = build_alibi_tensor(torch.ones(B, T, dtype=torch.long), H, torch.float32)  # (B*H, 1, T)
    torch.testing.assert_close(bias, library.view(B, H, 1, T).expand(B, H, T, T), atol=0, rtol=0)
    slopes = bias[0, :, 0, 1]  # m_h * j at j = 1
    torch.testing.assert_close(slopes, torch.tensor(interleaved_slopes(H)), atol=1e-7, rtol=0)
    _assert_row_constant_shift(bias[0], slopes)
    _assert_formed_as_the_model_forms_them(adapter, ids, bias, weights, scores)


# ----------------------------------------------------------------------------------------------------- MPT


def test_mpt_bias_is_its_alibi_corner_and_weights_are_output_attentions(dirs, ids) -> None:
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    adapter = _load(dirs, "mpt")
    assert (adapter.scheme, adapter.architecture, adapter.bias_convention) == ("alibi", "mpt", KEY_POSITION)
    assert (adapter.n_layers, adapter.n_heads, adapter.max_length) == (2, H, 40)
    bias, weights, scores = _capture(adapter, ids, _mpt_qk)
    assert bias.shape == (1, H, T, T)

    library = build_mpt_alibi_tensor(H, 40)  # (H, 1, max_seq_len): m_h * (j' - 39)
    torch.testing.assert_close(bias[0], library[:, :, -T:].expand(H, T, T), atol=0, rtol=0)
    # its slopes (alibi_bias_max 8) are Press et al.'s, and the whole matrix is shifted by -m_h * (T - 1)
    slopes = torch.tensor(interleaved_slopes(H))
    torch.testing.assert_close(bias[0, :, 0], slopes[:, None] * (torch.arange(T) - (T - 1)), atol=1e-6, rtol=0)
    _assert_row_constant_shift(bias[0], slopes)
    _assert_formed_as_the_model_forms_them(adapter, ids, bias, weights, scores)


# -------------------------------------------------------------------------------------------------- Falcon


def test_falcon_bias_is_build_alibi_tensor_scaled_and_weights_are_output_attentions(dirs, ids) -> None:
    from transformers import FalconModel
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor

    adapter = _load(dirs, "falcon")
    assert isinstance(adapter, FalconAdapter)
    assert (adapter.scheme, adapter.architecture, adapter.bias_convention) == ("alibi", "falcon", KEY_POSITION)
    bias, weights, scores = _capture(adapter, ids, _falcon_qk)
    assert bias.shape == (B, H, T, T)

    inv_norm = 1 / math.sqrt(48 // H)  # Falcon adds alibi before scaling q.k by 1/sqrt(d_head)
    library = build_alibi_tensor(torch.ones(B, T, dtype=torch.long), H, torch.float32)  # (B*H, 1, T), bfloat16 math
    torch.testing.assert_close(bias, (library * inv_norm).view(B, H, 1, T).expand(B, H, T, T), atol=0, rtol=0)
    # a function of the key alone (the same in every row), m_h * j up to Falcon's bfloat16 rounding, which
    # leaves it not exactly linear in j: diagonal normalization gives -m_h * (i - j) to bfloat16 precision only
    assert torch.equal(bias, bias[:, :, :1].expand_as(bias))
    exact = torch.tensor(interleaved_slopes(H))[:, None] * torch.arange(T) * inv_norm  # (H, T)
    torch.testing.assert_close(bias[0, :, 0], exact, atol=0, rtol=2**-7)
    assert not torch.equal(bias[0, :, 0], exact)

    with torch.no_grad():
        out = adapter.model(ids, output_attentions=True)
        sdpa = FalconModel.from_pretrained(dirs["falcon"], attn_implementation="sdpa", local_files_only=True).eval()
        reference = sdpa(ids).last_hidden_state
    _assert_weights(weights, out.attentions[LAYER])
    torch.testing.assert_close(_causal_softmax(scores + bias), weights, atol=1e-6, rtol=1e-5)
    # the eager forward the weights come from agrees with the model's default (SDPA) forward
    torch.testing.assert_close(out.last_hidden_state, reference, atol=1e-5, rtol=1e-5)


def test_falcon_eager_without_repair_adds_alibi_twice(dirs, ids) -> None:
    """Pins the transformers behaviour the repair exists for: fails once the library adds ALiBi once."""
    adapter = load_falcon(dirs["falcon"], repair_eager_alibi=False)
    bias, weights, scores = _capture(adapter, ids, _falcon_qk)
    torch.testing.assert_close(_causal_softmax(scores + 2 * bias), weights, atol=1e-6, rtol=1e-5)


def test_falcon_with_rotary_embeddings_is_traced_like_any_rope_model(dirs, ids, tmp_path) -> None:
    """``alibi: false`` adds no bias: the model is traced, and the weights of every call are the eager model's own
    ``output_attentions``."""
    from transformers import FalconForCausalLM

    import biasviz
    from biasviz.adapters.traced import TracedAdapter
    from biasviz.store import open_bias_file

    adapter = load_falcon(dirs["falcon_rope"])
    assert isinstance(adapter, TracedAdapter) and type(adapter.model) is FalconForCausalLM
    out = tmp_path / "falcon-rope.h5"
    biasviz.extract(dirs["falcon_rope"], ids.numpy(), out, layers="all", progress=False)
    eager = FalconForCausalLM.from_pretrained(dirs["falcon_rope"], attn_implementation="eager").eval()
    with torch.no_grad():
        attentions = eager(ids, output_attentions=True).attentions
    with open_bias_file(out) as f:
        assert list(f.layers) == [0, 1] and f.attrs["n_heads"] == H
        for layer in f.layers:
            torch.testing.assert_close(torch.from_numpy(f.read("weights", layer=layer)), attentions[layer],
                                       atol=1e-6, rtol=0)  # fmt: skip
