"""A model run in bfloat16 keeps its rotary frequencies in float32, as transformers keeps them whatever the model's
dtype: the angles position·θ_f of a bfloat16 ``inv_freq`` are off by about 1e-2 at T = 64."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

import biasviz


def test_bfloat16_runs_keep_inv_freq_in_float32(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                         intermediate_size=64, vocab_size=64, max_position_embeddings=128)  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    rotary = model.model.rotary_emb
    seen: list[tuple[torch.Tensor, torch.dtype]] = []
    rotary.register_forward_pre_hook(lambda module, args: seen.append((module.inv_freq.clone(), args[0].dtype)))
    head = config.hidden_size // config.num_attention_heads
    exact = 1.0 / 10000.0 ** (np.arange(0, head, 2) / head)  # θ_f in float64
    ids = torch.randint(1, 64, (3, 64), generator=torch.Generator().manual_seed(1))
    biasviz.extract(model, ids, tmp_path / "s.h5", summary=True, progress=False, model_dtype="bfloat16")
    assert seen and all(x == torch.bfloat16 for _, x in seen)  # the model itself ran in bfloat16
    for inv_freq, _ in seen:
        assert inv_freq.dtype == torch.float32
        angles = 63 * inv_freq.double().numpy()  # the last position's angles
        np.testing.assert_allclose(angles, 63 * exact, rtol=1e-6)
    assert rotary.inv_freq.dtype == torch.float32 and math.isclose(float(rotary.inv_freq[1]), exact[1], rel_tol=1e-6)


def test_a_bfloat16_run_rotates_as_transformers_own_bfloat16_load_at_2048(tmp_path: Path) -> None:
    """The q and k a bfloat16 run hands its attention call at T = 2048 are those of transformers' own bfloat16 load of
    the same directory (from_pretrained with dtype=bfloat16): the rotation's angles reach 2047·θ_f, where a bfloat16
    inv_freq would be off by whole radians."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.adapters.test_rotary_detection import sdpa_operands

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1,
                         intermediate_size=64, vocab_size=64, max_position_embeddings=2048)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    ids = torch.randint(1, 64, (1, 2048), generator=torch.Generator().manual_seed(3))
    own = LlamaForCausalLM.from_pretrained(tmp_path / "llama", dtype=torch.bfloat16).eval()
    (want_q, want_k), = sdpa_operands(own, ids)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    original = torch.nn.functional.scaled_dot_product_attention

    def caught(q, k, *args, **kwargs):  # noqa: ANN001, ANN202 - every call biasviz's run makes
        if q.shape[-2] == 2048:
            seen.append((q.double(), k.double()))
        return original(q, k, *args, **kwargs)

    torch.nn.functional.scaled_dot_product_attention = caught
    try:
        biasviz.extract(str(tmp_path / "llama"), ids.numpy(), tmp_path / "s.h5", summary=True, progress=False,
                        model_dtype="bfloat16")  # fmt: skip
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    assert seen, "biasviz's run made no call of 2048 positions"
    got_q, got_k = seen[0]
    torch.testing.assert_close(got_q, want_q, rtol=0, atol=0)
    torch.testing.assert_close(got_k, want_k, rtol=0, atol=0)
