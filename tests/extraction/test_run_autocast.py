"""A model run under the caller's ``torch.autocast`` (docs/own-model.md): its own kernels run in bfloat16 as the caller
asked, and the file holds float32 scores and weights that are the math of the q and k its call received, with the
autocast recorded. The reference is float64 numpy on the q, k and scale caught at the model's own SDPA call during
a plain forward under the same autocast (torch's function wrapped here, not through biasviz).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz

T, N, HEADS = 16, 3, 4


@pytest.fixture(scope="module")
def llama() -> tuple[torch.nn.Module, torch.Tensor, np.ndarray]:
    """A transformers Llama, its ids, and float64 weights from the q and k its call received under autocast."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=2, num_hidden_layers=1,
                         intermediate_size=64, vocab_size=64, max_position_embeddings=64,
                         attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(1, 64, (N, T), generator=torch.Generator().manual_seed(1))
    seen = {}
    original = torch.nn.functional.scaled_dot_product_attention

    def wrapped(q, k, v, attn_mask=None, is_causal=False, scale=None, enable_gqa=False, **kw):
        assert attn_mask is None and is_causal
        seen["q"], seen["k"] = q.double(), k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        seen["c"] = q.shape[-1] ** -0.5 if scale is None else scale
        return original(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa, **kw)

    torch.nn.functional.scaled_dot_product_attention = wrapped
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model(ids)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    scores = seen["c"] * np.einsum("nhid,nhjd->nhij", seen["q"].numpy(), seen["k"].numpy())
    z = np.where(np.tril(np.ones((T, T), dtype=bool)), scores, -np.inf)
    w = np.exp(z - z.max(-1, keepdims=True))
    return model, ids, w / w.sum(-1, keepdims=True)


@pytest.mark.parametrize("summary", [False, True], ids=["full file", "summary"])
def test_weights_are_the_math_of_the_operands_and_the_model_runs_under_autocast(
    llama: tuple[torch.nn.Module, torch.Tensor, np.ndarray], tmp_path: Path, summary: bool
) -> None:
    model, ids, weights = llama
    kinds: list[torch.dtype] = []
    hook = model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, a, out: kinds.append(out.dtype))
    out = tmp_path / "a.h5"
    try:
        with warnings.catch_warnings(), torch.autocast("cpu", dtype=torch.bfloat16):
            warnings.simplefilter("ignore")
            biasviz.extract(model, ids, out, summary=summary, progress=False)
    finally:
        hook.remove()
    assert kinds and set(kinds) == {torch.bfloat16}  # the model's own projections ran as the caller asked
    with h5py.File(out, "r") as f:
        assert f.attrs["autocast"] == "cpu: bfloat16"
        got = f["layer_0/weights_mean" if summary else "layer_0/weights"][()]
    assert got.dtype == np.float32
    want = np.where(np.tril(np.ones((T, T), dtype=bool)), weights.mean(0), np.nan) if summary else weights
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
