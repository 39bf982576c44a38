"""The model's configuration (:mod:`biasviz.model.config`): the named size presets and clear errors."""

from __future__ import annotations

import pytest

from biasviz.common.errors import BiasvizError
from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM
from biasviz.model.config import PRESETS


def test_presets_have_gpt2_small_shape_and_twelve_heads() -> None:
    assert PRESETS["gpt2-small"] == {
        "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 50257,
    }  # fmt: skip
    assert PRESETS["tiny"]["n_head"] == 12
    cfg = BiasGPTConfig.from_preset("gpt2-small", "alibi")
    n_params = sum(p.numel() for p in BiasGPTForCausalLM(cfg).parameters())
    assert 123_000_000 < n_params < 125_000_000  # GPT-2 small: 124M with tied embeddings, less wpe


def test_bad_config_is_a_clear_error() -> None:
    with pytest.raises(BiasvizError, match="multiple of n_head"):
        BiasGPTConfig(scheme="alibi", n_embd=50, n_head=12)
    with pytest.raises(BiasvizError, match="unknown preset"):
        BiasGPTConfig.from_preset("huge", "alibi")
