"""docs/positional.md for a model biasviz has no adapter for: a transformers Llama (rotary positions, grouped keys),
its SDPA calls traced and formed again row block by row block from the q and k they received.

The reference takes q and k by forward hooks on the model's own ``q_proj``/``k_proj``, rotates them with
transformers' own ``apply_rotary_pos_emb`` and computes scores, weights, P, the key profile and sink shares in
numpy float64 from their definitions.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

import biasviz
from biasviz.adapters.transformers_traced import load_transformers_sdpa
from biasviz.common.errors import BiasvizError
from biasviz.extraction.summary import extract_summary
from tests.summaries.test_position import LOWER, T, _block_means
from tests.summaries.tiny_llama import save_tiny_llama

N, HEADS, KV_HEADS = 3, 4, 2


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("llama"), T, heads=HEADS, kv_heads=KV_HEADS)


def _reference(path: Path, ids: np.ndarray, layer: int) -> dict[str, np.ndarray]:
    """q, k (N, H, T, hd) after transformers' rotation (keys repeated per group), the scale, float64."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    model = LlamaForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    attn = model.model.layers[layer].self_attn
    got: dict[str, torch.Tensor] = {}
    hooks = [attn.q_proj.register_forward_hook(lambda m, a, out: got.update(q=out)),
             attn.k_proj.register_forward_hook(lambda m, a, out: got.update(k=out))]  # fmt: skip
    with torch.no_grad():
        model(torch.from_numpy(ids))
        hd = attn.head_dim
        q = got["q"].view(N, T, HEADS, hd).transpose(1, 2)
        k = got["k"].view(N, T, KV_HEADS, hd).transpose(1, 2)
        positions = torch.arange(T)[None].expand(N, T)
        cos, sin = model.model.rotary_emb(q, positions)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    for h in hooks:
        h.remove()
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    return {"q": q.double().numpy(), "k": k.double().numpy(), "scale": float(attn.scaling)}


@pytest.mark.parametrize("resolution", [T, 16])
def test_traced_llama_scores_positional_logits_key_profile_and_sinks_equal_numpy(llama_dir: Path, tmp_path: Path,
                                                                                 resolution: int) -> None:  # fmt: skip
    ids = np.random.default_rng(1).integers(0, 100, size=(N, T))
    r = _reference(llama_dir, ids, layer=1)
    c, n = r["scale"], N
    scores = c * np.einsum("ahid,ahjd->ahij", r["q"], r["k"])
    masked = np.where(LOWER, scores, -np.inf)
    w = np.exp(masked - masked.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    cross = np.einsum("hid,hjd->hij", r["q"].sum(0), r["k"].sum(0))
    p = c * (cross - np.einsum("ahid,ahjd->hij", r["q"], r["k"])) / (n * (n - 1))
    scores[..., ~LOWER] = np.nan
    p[..., ~LOWER] = np.nan
    adapter = load_transformers_sdpa(llama_dir)
    assert isinstance(adapter, biasviz.adapters.traced.TracedAdapter)
    extract_summary(adapter, ids, tmp_path / "sum.h5", layers=[1], resolution=resolution, batch_size=2,
                    device="cpu", progress=False)  # fmt: skip
    tol = {"rtol": 1e-5, "atol": 1e-5}
    with h5py.File(tmp_path / "sum.h5") as f:
        g, b = f["layer_1"], f.attrs["block"]
        np.testing.assert_allclose(g["scores_mean"][()], _block_means(scores.mean(0), b), equal_nan=True, **tol)
        np.testing.assert_allclose(g["scores_std"][()], _block_means(scores.std(0), b), equal_nan=True, rtol=1e-4,
                                   atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(g["weights_mean"][()], _block_means(np.where(LOWER, w, np.nan).mean(0), b),
                                   equal_nan=True, **tol)  # fmt: skip
        np.testing.assert_allclose(g["positional_mean"][()], _block_means(p, b), equal_nan=True, **tol)
        by_d = np.stack([[np.diagonal(p[h], -d).mean() for d in range(T)] for h in range(HEADS)])
        np.testing.assert_allclose(g["positional_profile"][0], by_d, **tol)
        seen = [w[:, :, j:, j] for j in range(T)]
        np.testing.assert_allclose(g["weights_key_profile"][0], np.stack([s.mean(axis=(0, 2)) for s in seen], -1),
                                   **tol)  # fmt: skip
        np.testing.assert_allclose(g["sink_share"][()], w[:, :, :, 0].mean(-1), **tol)
        assert "bias_mean" not in g
    from biasviz.cli.extract_cmd import _summarised

    said = _summarised(tmp_path / "sum.h5", 1, "captured")
    assert said == ("weights, scores, positional logits, position measures and rotary frequencies "
                    "(scheme 'captured' adds no bias)")


def test_traced_summary_equals_the_traced_full_extract_reduced(llama_dir: Path, tmp_path: Path) -> None:
    """The rows formed again are the weights the trace forms in a full extract: per-cell mean and spread agree."""
    ids = np.random.default_rng(2).integers(0, 100, size=(4, T))
    biasviz.extract(str(llama_dir), ids, tmp_path / "full.h5", layers=[0], device="cpu", progress=False)
    extract_summary(load_transformers_sdpa(llama_dir), ids, tmp_path / "sum.h5", layers=[0], resolution=T,
                    device="cpu", progress=False)  # fmt: skip
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        w = full["layer_0/weights"][()].astype(np.float64)
        w[..., ~LOWER] = np.nan
        np.testing.assert_allclose(summ["layer_0/weights_mean"][()], w.mean(0), rtol=1e-5, atol=1e-6, equal_nan=True)
        np.testing.assert_allclose(summ["layer_0/weights_std"][()], w.std(0), rtol=1e-4, atol=1e-6, equal_nan=True)


def test_a_bias_that_appears_after_the_first_sample_is_a_clear_error(tmp_path: Path) -> None:
    """A model whose SDPA call adds a float mask only for some inputs: the rows cannot be formed from q and k."""

    class Sometimes(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 8)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids)[:, None]  # (B, 1, T, 8)
            t = ids.shape[-1]
            mask = torch.zeros(t, t).masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
            if bool((ids[:, 0] == 7).any()):
                mask = mask + torch.arange(t)[None, :] * 0.1  # a bias, for these inputs only
            return torch.nn.functional.scaled_dot_product_attention(x, x, x, attn_mask=mask)

    from biasviz.adapters.traced import TracedAdapter

    ids = np.random.default_rng(0).integers(8, 50, size=(3, 16))
    ids[2, 0] = 7
    with pytest.raises(BiasvizError, match="added a bias for sample 2"):
        extract_summary(TracedAdapter(Sometimes().eval()), ids, tmp_path / "s.h5", layers=[0], device="cpu",
                        progress=False)  # fmt: skip
    assert not (tmp_path / "s.h5").exists()


class _Windowed(torch.nn.Module):
    """Self-attention over a sliding window of 5 keys (Mistral's local attention), as a boolean SDPA mask."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.embed = torch.nn.Embedding(50, 16)
        self.qk = torch.nn.Linear(16, 32)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        q, k = self.qk(x).view(*ids.shape, 2, 2, 8).unbind(2)  # (B, T, 2 heads, 8) each
        t = ids.shape[-1]
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        window = (j <= i) & (j > i - 5)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=window)


def test_a_sliding_window_mask_is_formed_again_as_the_call_masked(tmp_path: Path) -> None:
    from biasviz.adapters.traced import TracedAdapter

    ids = np.random.default_rng(4).integers(0, 50, size=(3, 24))
    model = _Windowed().eval()
    biasviz.extract(TracedAdapter(model), ids, tmp_path / "full.h5", layers=[0], device="cpu", progress=False)
    extract_summary(TracedAdapter(model), ids, tmp_path / "sum.h5", layers=[0], resolution=24, device="cpu",
                    progress=False)  # fmt: skip
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        w = full["layer_0/weights"][()].astype(np.float64)
        i, j = np.indices((24, 24))
        w[..., ~((j <= i) & (j > i - 5))] = np.nan  # cells outside the window are in no mean (docs/hdf5.md)
        np.testing.assert_allclose(summ["layer_0/weights_mean"][()], w.mean(0), rtol=1e-5, atol=1e-6, equal_nan=True)
        assert np.all(np.isnan(summ["layer_0/weights_mean"][:, 10, :6]))  # keys before the window: never looked at
        assert summ.attrs["mask"] == "model" and np.array_equal(summ["layer_0/attended"][0], (j <= i) & (j > i - 5))
        assert "positional_mean" in summ["layer_0"]


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_every_traced_call_hands_over_its_own_rotated_q_and_k(llama_dir: Path, attention: str) -> None:
    """With the scores, a call keeps the q and k it received (after the rotation, keys repeated per group) and its
    scale, what P is made of: from SDPA's operands, or from an eager product followed through its reshapes."""
    from transformers import LlamaForCausalLM

    from biasviz.tracing.mode import Trace

    ids = np.random.default_rng(2).integers(0, 100, size=(N, T))
    r = _reference(llama_dir, ids, layer=1)
    model = LlamaForCausalLM.from_pretrained(llama_dir, attn_implementation=attention).eval()
    with torch.no_grad(), Trace(model, [1], scores=True) as t:
        model(torch.from_numpy(ids))
    call = t.calls[1]
    assert call.kind == attention and call.scale == pytest.approx(r["scale"])
    np.testing.assert_allclose(call.q.numpy(), r["q"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(call.k.numpy(), r["k"], rtol=1e-5, atol=1e-5)
