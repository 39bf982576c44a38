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
