"""Tiny saved transformers models (BLOOM, MPT, Falcon with ALiBi and with rotary positions, T5, GPT-2; 12 heads)
and what their adapters' tests share: loading one, capturing a layer, the library's own scaled q.k of each
architecture, and the checks of weights and ALiBi biases (test_transformers_alibi.py, test_transformers_base.py,
test_transformers_models.py).

Every model is a tiny random one built from its config class and saved to a temporary directory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from biasviz.adapters.transformers_models import HF_ARCHITECTURES
from biasviz.extraction.full_matrices import full_matrices

B, T, H, VOCAB = 2, 24, 12, 64
LAYER = 1  # not the first: the bias must be the one passed on to later layers too


def _save(model: nn.Module, path: Path) -> Path:
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One saved random model per architecture (12 heads: the non-power-of-two ALiBi slope rule)."""
    from transformers import (
        BloomConfig,
        BloomForCausalLM,
        FalconConfig,
        FalconForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        MptConfig,
        MptForCausalLM,
        T5Config,
        T5ForConditionalGeneration,
    )

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("hf")
    falcon = dict(
        vocab_size=VOCAB,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=H,
        alibi=True,
        new_decoder_architecture=False,
        multi_query=False,
        parallel_attn=False,
        bias=True,
    )
    t5 = T5Config(
        vocab_size=VOCAB,
        d_model=48,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=3,
        num_heads=H,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=16,
        dropout_rate=0.0,
    )
    return {
        "bloom": _save(
            BloomForCausalLM(BloomConfig(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=H)), root / "bloom"
        ),
        "mpt": _save(
            MptForCausalLM(MptConfig(vocab_size=VOCAB, d_model=48, n_layers=2, n_heads=H, max_seq_len=40)), root / "mpt"
        ),
        "falcon": _save(FalconForCausalLM(FalconConfig(**falcon)), root / "falcon"),
        "falcon_rope": _save(FalconForCausalLM(FalconConfig(**{**falcon, "alibi": False})), root / "falcon_rope"),
        "t5": _save(T5ForConditionalGeneration(t5), root / "t5"),
        "gpt2": _save(
            GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=H, n_positions=64)), root / "gpt2"
        ),
    }


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1))  # (B, T)


def _load(dirs: dict[str, Path], model_type: str, **kwargs: object):
    import json

    assert json.loads((dirs[model_type] / "config.json").read_text())["model_type"] == model_type
    return HF_ARCHITECTURES[model_type](dirs[model_type], None, **kwargs)


def _capture(adapter, ids: torch.Tensor, qk: Callable[[nn.Module, torch.Tensor], torch.Tensor] | None = None):
    """Captured bias and weights of LAYER, and (with ``qk``) the layer's scaled q.k scores (B, H, T, T)."""
    seen: dict[str, torch.Tensor] = {}
    handle = None
    if qk is not None:
        attn = adapter.attention(LAYER)
        handle = attn.register_forward_hook(lambda mod, args, out: seen.__setitem__("scores", qk(mod, args[0])))
    try:
        with full_matrices(adapter, [LAYER]) as cap:
            adapter.forward(ids)
    finally:
        if handle is not None:
            handle.remove()
    return cap.bias.get(LAYER), cap.weights[LAYER], seen.get("scores")


def _causal_softmax(scores: torch.Tensor, causal: bool = True) -> torch.Tensor:
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1)


def _assert_row_constant_shift(bias: torch.Tensor, slopes: torch.Tensor, atol: float = 1e-5) -> None:
    """bias - (-m_h * (i - j)) is one constant per (head, query row) over the causal cells."""
    d = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T) i - j
    shift = bias - (-slopes[:, None, None] * d)  # (H, T, T)
    causal = d >= 0
    for i in range(T):
        row = shift[:, i][:, causal[i]]  # (H, i + 1)
        torch.testing.assert_close(row, row[:, :1].expand_as(row), atol=atol, rtol=0)
    normalized = bias - bias.diagonal(dim1=-2, dim2=-1)[..., :, None]  # diagonal normalization
    torch.testing.assert_close(normalized[:, causal], (-slopes[:, None, None] * d)[:, causal], atol=atol, rtol=0)


def _assert_weights(weights: torch.Tensor, library: torch.Tensor, causal: bool = True) -> None:
    torch.testing.assert_close(weights, library, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T), atol=1e-5, rtol=0)
    if causal:
        assert weights[..., torch.ones(T, T, dtype=torch.bool).triu(1)].abs().max() == 0


def _assert_formed_as_the_model_forms_them(adapter, ids: torch.Tensor, bias: torch.Tensor, weights: torch.Tensor,
                                           scores: torch.Tensor) -> None:  # fmt: skip
    """The captured weights are transformers' own ``output_attentions`` of LAYER, and softmax(scores + bias): the
    captured bias is what the model added."""
    with torch.no_grad():
        out = adapter.model(ids, output_attentions=True)
    _assert_weights(weights, out.attentions[LAYER])
    torch.testing.assert_close(_causal_softmax(scores + bias), weights, atol=1e-6, rtol=1e-5)


# --- each architecture's own scaled q.k, from its attention module's projections


def _bloom_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = mod._reshape(mod.query_key_value(hidden))  # (B, H, T, hd) each
    return q @ k.transpose(-1, -2) * mod.inv_norm_factor


def _mpt_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = (x.view(B, T, H, -1).transpose(1, 2) for x in mod.Wqkv(hidden).chunk(3, dim=2))  # (B, H, T, hd)
    return q @ k.transpose(-1, -2) * mod.softmax_scale


def _falcon_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = mod._split_heads(mod.query_key_value(hidden))  # (B, T, H, hd) each
    return q.transpose(1, 2) @ k.permute(0, 2, 3, 1) * mod.inv_norm_factor


def _t5_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q = mod.q(hidden).view(B, T, H, -1).transpose(1, 2)  # (B, H, T, d_kv)
    k = mod.k(hidden).view(B, T, H, -1).transpose(1, 2)
    return q @ k.transpose(-1, -2)  # T5 does not scale q.k


def _gpt2_qk(mod: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    q, k, _ = (x.view(B, T, H, -1).transpose(1, 2) for x in mod.c_attn(hidden).split(48, dim=2))
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
