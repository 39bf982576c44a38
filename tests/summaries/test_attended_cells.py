"""Summaries over the cells a model's own mask attends to (docs/hdf5.md, 'Attended cells'): a sliding-window
transformers model.

The reference is float64 math on the q, k, scale and mask caught at the model's own SDPA call during a plain
forward (torch's function wrapped here, not through biasviz): weights by softmax over the attended cells only, the
positional logits P(i, j) as the mean over ordered pairs of different texts of c·q_a(i)·k_b(j), and every mean,
profile and diagnostic over the attended cells. A cell outside the window is NaN in every map.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz

T, N, HEADS, KV_HEADS, VOCAB, WINDOW = 16, 3, 4, 2, 64, 5


def caught_call(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """q, k (key heads repeated), scale and the attended cells of the model's one SDPA call, as it made it."""
    seen: dict[str, torch.Tensor] = {}
    original = torch.nn.functional.scaled_dot_product_attention

    def wrapped(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False, **kw):
        groups = q.shape[1] // k.shape[1]
        seen["q"], seen["k"] = q.double(), k.repeat_interleave(groups, dim=1).double()
        seen["scale"] = torch.tensor(q.shape[-1] ** -0.5 if scale is None else scale)
        i, j = torch.arange(q.shape[-2])[:, None], torch.arange(k.shape[-2])[None, :]
        kept = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool)
        if is_causal:
            kept &= j <= i
        if attn_mask is not None:
            kept = kept & (attn_mask if attn_mask.dtype == torch.bool else attn_mask > -1e9)
        seen["kept"] = torch.broadcast_to(kept, (q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]))
        return original(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                        enable_gqa=enable_gqa, **kw)  # fmt: skip

    torch.nn.functional.scaled_dot_product_attention = wrapped
    try:
        with torch.no_grad():
            model(ids)
    finally:
        torch.nn.functional.scaled_dot_product_attention = original
    return seen


def reference(call: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    q, k, c = call["q"].numpy(), call["k"].numpy(), float(call["scale"])
    kept = call["kept"].numpy()  # (N, H, T, T)
    assert (kept == kept[:1]).all() and not kept[0, 0, T - 1, 0]  # one mask for all; the window hides key 0
    mask = kept[0]
    scores = c * np.einsum("nhid,nhjd->nhij", q, k)
    z = np.where(kept, scores, -np.inf)
    w = np.exp(z - z.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    nan = np.where(mask, 1.0, np.nan)
    # P: the mean over ordered pairs a != b of c q_a(i) . k_b(j)
    pairs = [(a, b) for a in range(N) for b in range(N) if a != b]
    p = np.mean([c * np.einsum("hid,hjd->hij", q[a], k[b]) for a, b in pairs], axis=0)
    d = np.subtract.outer(np.arange(T), np.arange(T))
    out = {"weights_mean": w.mean(0) * nan, "weights_std": w.std(0) * nan, "scores_mean": scores.mean(0) * nan,
           "positional_mean": p * nan}  # fmt: skip
    profile = np.full((2, HEADS, T), np.nan)
    for dist in range(T):
        cells = mask & (d == dist)  # (H, T, T)
        for h in range(HEADS):
            if cells[h].any():
                values = w[:, h][:, cells[h]]  # (N, cells)
                profile[:, h, dist] = values.mean(), values.std()
    out["weights_profile"] = profile
    seen_by = mask.sum(1)  # (H, T): queries that see each key
    key_mean = w.sum(2).mean(0) / seen_by
    key_sq = (w**2).sum(2).mean(0) / seen_by
    out["weights_key_profile"] = np.stack([key_mean, np.sqrt(np.maximum(key_sq - key_mean**2, 0.0))])
    out["sink_share"] = w[:, :, :, 0].sum(-1) / seen_by[:, 0]
    out["positional_diagnostics"] = np.array([diagnostics(p[h], mask[h]) for h in range(HEADS)])
    return out


def diagnostics(m: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """Toeplitz and separability residuals of one head's P over the attended cells, by explicit least squares."""
    i, j = np.nonzero(mask)
    values = m[i, j]
    spread = values.std()
    diag_mean = {dist: values[i - j == dist].mean() for dist in set(i - j)}
    toeplitz = np.sqrt(np.mean([(v - diag_mean[a - b]) ** 2 for v, a, b in zip(values, i, j, strict=True)]))
    design = np.zeros((len(values), T))
    off = i != j
    design[np.arange(len(values))[off], i[off]] = 1.0
    design[np.arange(len(values))[off], j[off]] = -1.0
    s = np.linalg.lstsq(design, values, rcond=None)[0]
    separability = np.sqrt(np.mean((values - design @ s) ** 2))
    return toeplitz / spread, separability / spread


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def window(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, np.ndarray]]:
    """A summary of the model through its SDPA call (whose rows are formed again) or its eager attention (whose
    weights stream as the model forms them), against the reference from the SDPA call of the same weights."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    config = MistralConfig(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                           num_hidden_layers=1, intermediate_size=64, vocab_size=VOCAB, sliding_window=WINDOW,
                           max_position_embeddings=64, attn_implementation="sdpa")  # fmt: skip
    model = MistralForCausalLM(config).eval()
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(2))
    expected = reference(caught_call(model, ids))
    model.set_attn_implementation(request.param)
    out = tmp_path_factory.mktemp("window") / "s.h5"
    biasviz.extract(model, ids, out, summary=True, progress=False)
    return out, expected


@pytest.mark.parametrize("name", ["weights_mean", "weights_std", "scores_mean", "positional_mean", "weights_profile",
                                  "weights_key_profile", "sink_share"])  # fmt: skip
def test_every_map_and_profile_is_over_the_window(window, name: str) -> None:
    path, expected = window
    with h5py.File(path, "r") as f:
        got = f["layer_0"][name][()]
    want = expected[name]
    assert np.array_equal(np.isnan(got), np.isnan(want)), name  # cells outside the window: NaN, and only those
    # a spread by key is the root of a difference of float32 sums of squares: about 1e-8 of the squares' scale
    atol = 1e-5 if name == "weights_key_profile" else 2e-6
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=atol, equal_nan=True)


def test_positional_diagnostics_are_over_the_window(window) -> None:
    path, expected = window
    with h5py.File(path, "r") as f:
        got = f["layer_0"]["positional_diagnostics"][()]
    measured = np.array([[row["toeplitz_residual"], row["separability_residual"]] for row in got])
    np.testing.assert_allclose(measured, expected["positional_diagnostics"], rtol=1e-4)


def _forward_caught(module: Any, caught: Any, model: torch.nn.Module, ids: torch.Tensor) -> None:
    """One plain forward of ``model`` with transformers' ``module.eager_attention_forward`` wrapped by ``caught``."""
    original = module.eager_attention_forward
    module.eager_attention_forward = caught(original)
    try:
        with torch.no_grad():
            model(ids)
    finally:
        module.eager_attention_forward = original


def _pairwise(q: np.ndarray, k: np.ndarray, c: float) -> np.ndarray:
    """P(i, j): the mean over ordered pairs a != b of texts of c·q_a(i)·k_b(j)."""
    pairs = [(a, b) for a in range(len(q)) for b in range(len(q)) if a != b]
    return np.mean([c * np.einsum("hid,hjd->hij", q[a], k[b]) for a, b in pairs], axis=0)


def test_softcapped_calls_keep_scores_and_positional_logits_before_the_cap(tmp_path: Path) -> None:
    """Gemma-2 caps its scores (c·tanh(s / c)) before the softmax, one layer in a sliding window: the summary stores the
    scores the call's inputs give (scale·q·kᵀ, before the cap) and P from q and k (docs/hdf5.md, 'Attended cells'), each
    over the attended cells, while its weights are the capped softmax's."""
    from transformers import Gemma2Config, Gemma2ForCausalLM
    from transformers.models.gemma2 import modeling_gemma2

    torch.manual_seed(0)
    config = Gemma2Config(hidden_size=32, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=8,
                          num_hidden_layers=2, intermediate_size=64, vocab_size=VOCAB, sliding_window=WINDOW,
                          attn_logit_softcapping=5.0, final_logit_softcapping=None, max_position_embeddings=64,
                          attn_implementation="eager")  # fmt: skip
    model = Gemma2ForCausalLM(config).eval()
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(5))
    seen: list[dict[str, Any]] = []

    def caught(original):  # noqa: ANN001, ANN202
        def wrapped(module, query, key, value, attention_mask, *args, scaling=None, softcap=None, **kwargs):
            groups = query.shape[1] // key.shape[1]
            i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
            kept = (attention_mask[..., :T] > -1e9) if attention_mask is not None else (j <= i)
            seen.append({"q": query.double(), "k": key.repeat_interleave(groups, dim=1).double(), "c": scaling,
                         "cap": softcap, "kept": torch.broadcast_to(kept, (N, HEADS, T, T))})  # fmt: skip
            return original(module, query, key, value, attention_mask, *args, scaling=scaling, softcap=softcap,
                            **kwargs)  # fmt: skip

        return wrapped

    _forward_caught(modeling_gemma2, caught, model, ids)
    out = tmp_path / "g.h5"
    biasviz.extract(model, ids, out, layers="all", summary=True, progress=False)
    with h5py.File(out, "r") as f:
        for layer, call in enumerate(seen):
            q, k, c, cap = call["q"].numpy(), call["k"].numpy(), call["c"], call["cap"]
            mask = call["kept"][0].numpy()
            nan = np.where(mask, 1.0, np.nan)
            scores = c * np.einsum("nhid,nhjd->nhij", q, k)
            z = np.where(call["kept"].numpy(), cap * np.tanh(scores / cap), -np.inf)
            w = np.exp(z - z.max(-1, keepdims=True))
            w /= w.sum(-1, keepdims=True)
            p = _pairwise(q, k, c)
            g = f[f"layer_{layer}"]
            np.testing.assert_allclose(g["scores_mean"][()], scores.mean(0) * nan, rtol=2e-5, atol=2e-6, equal_nan=True)
            np.testing.assert_allclose(g["positional_mean"][()], p * nan, rtol=2e-5, atol=2e-6, equal_nan=True)
            np.testing.assert_allclose(g["weights_mean"][()], w.mean(0) * nan, rtol=2e-5, atol=2e-6, equal_nan=True)
    assert not bool(seen[0]["kept"][0, 0, T - 1, 0]) and bool(seen[1]["kept"][0, 0, T - 1, 0])  # a window, then all


def test_a_flex_block_mask_window_is_summarised_over_its_cells(tmp_path: Path) -> None:
    """flex_attention with a sliding-window block mask (its rows formed again over it, as an SDPA call's): the mean
    weights over the window, NaN outside it, against float64 math on the module's own q and k."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def window(b, h, q, kv):  # noqa: ANN001, ANN202 - flex's mask_mod signature
        return (kv <= q) & (kv > q - 4)

    class Windowed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(VOCAB, 16)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            x = self.embed(ids).view(*ids.shape, 2, 8).transpose(1, 2)
            return flex_attention(x, x, x, block_mask=create_block_mask(window, None, None, T, T, device="cpu"))

    torch.manual_seed(0)
    model = Windowed().eval()
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(6))
    biasviz.extract(model, ids, tmp_path / "f.h5", summary=True, progress=False)
    with torch.no_grad():
        x = model.embed(ids).view(N, T, 2, 8).transpose(1, 2).double()
    i, j = np.indices((T, T))
    keep = (j <= i) & (j > i - 4)
    z = np.where(keep, (x @ x.transpose(-1, -2)).numpy() / np.sqrt(8), -np.inf)
    w = np.exp(z - z.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).mean(0) * np.where(keep, 1.0, np.nan)
    with h5py.File(tmp_path / "f.h5", "r") as f:
        assert f.attrs["mask"] == "model"
        np.testing.assert_allclose(f["layer_0/weights_mean"][()], w, rtol=2e-5, atol=2e-6, equal_nan=True)


def test_sink_columns_and_a_row_shift_keep_the_scores_and_positional_logits_of_the_keys(tmp_path: Path) -> None:
    """GPT-OSS appends a learned sink column to every row and subtracts the row maximum before the softmax: the
    summary stores the keys' scores unshifted (scale·q·kᵀ) and P from q and k over the attended cells (a sliding
    layer, then a global one), while its weights are the model's own (the sink's share left out)."""
    from transformers.models.gpt_oss import modeling_gpt_oss

    from tests.tracing.test_eager_kept_sinks import gpt_oss

    model = gpt_oss(2, sink_std=1.0)
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(7))
    seen: list[dict[str, Any]] = []

    def caught(original):  # noqa: ANN001, ANN202
        def wrapped(module, query, key, value, attention_mask, scaling, *args, **kwargs):
            out = original(module, query, key, value, attention_mask, scaling, *args, **kwargs)
            groups = query.shape[1] // key.shape[1]
            seen.append({"q": query.double(), "k": key.repeat_interleave(groups, dim=1).double(), "c": scaling,
                         "kept": torch.broadcast_to(attention_mask[..., :T] > -1e9, (N, HEADS, T, T)),
                         "w": out[1].double()})  # fmt: skip
            return out

        return wrapped

    _forward_caught(modeling_gpt_oss, caught, model, ids)
    out = tmp_path / "o.h5"
    biasviz.extract(model, ids, out, layers="all", summary=True, progress=False)
    with h5py.File(out, "r") as f:
        for layer, call in enumerate(seen):
            q, k, c = call["q"].numpy(), call["k"].numpy(), call["c"]
            nan = np.where(call["kept"][0].numpy(), 1.0, np.nan)
            scores = c * np.einsum("nhid,nhjd->nhij", q, k)
            p = _pairwise(q, k, c)
            g = f[f"layer_{layer}"]
            np.testing.assert_allclose(g["scores_mean"][()], scores.mean(0) * nan, rtol=2e-5, atol=2e-6, equal_nan=True)
            np.testing.assert_allclose(g["positional_mean"][()], p * nan, rtol=2e-5, atol=2e-6, equal_nan=True)
            np.testing.assert_allclose(g["weights_mean"][()], call["w"].numpy().mean(0) * nan, rtol=2e-5, atol=2e-6,
                                       equal_nan=True)  # fmt: skip
    assert not bool(seen[0]["kept"][0, 0, T - 1, 0]) and bool(seen[1]["kept"][0, 0, T - 1, 0])
