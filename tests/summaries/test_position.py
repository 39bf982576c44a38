"""docs/positional.md in summaries: scores, positional logits P, the weights' key profile and sink shares.

Each is computed here in numpy float64 from the model's own q and k (read at ``hook_q``/``hook_k`` in a plain
forward), its bias (a full extract) and its weights (the same full extract), by the definitions, and compared
with what ``extract --summary`` stored.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from biasviz.adapters.biasviz_gpt import BiasGPTAdapter
from biasviz.extraction.run import extract
from biasviz.extraction.summary import extract_summary
from biasviz.model import capture
from biasviz.schemes.registry import TABLE
from tests.conftest import small_model

N, T = 3, 64


def _windows(n: int = N, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 97, size=(n, T))


def _block_means(cells: np.ndarray, b: int) -> np.ndarray:
    """(..., T, T), NaN on unused cells -> (..., nb, nb) means over each block's used cells."""
    nb = -(-T // b)
    padded = np.full((*cells.shape[:-2], nb * b, nb * b), np.nan)
    padded[..., :T, :T] = cells
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(padded.reshape(*cells.shape[:-2], nb, b, nb, b), axis=(-3, -1))


def _reference(model: torch.nn.Module, ids: np.ndarray, tmp_path: Path, layer: int) -> dict[str, np.ndarray]:
    """Per sample, from the model's own tensors: q, k (N, H, T, hd), bias (N, H, T, T) or zeros, weights."""
    got: dict[str, torch.Tensor] = {}
    names = [f"blocks.{layer}.attn.hook_q", f"blocks.{layer}.attn.hook_k"]
    with capture(model, names, lambda t, n, _r: got.update({n.rsplit("_", 1)[1]: t})), torch.no_grad():
        model(torch.from_numpy(ids))
    adapter = BiasGPTAdapter(model, source="test")
    extract(adapter, ids, tmp_path / "full.h5", layers=[layer], device="cpu", progress=False)
    with h5py.File(tmp_path / "full.h5") as f:
        g = f[f"layer_{layer}"]
        weights = g["weights"][()].astype(np.float64)
        bias = np.broadcast_to(g["bias"][()], weights.shape).astype(np.float64) if "bias" in g else None
    q, k = (got[x].double().numpy().transpose(0, 2, 1, 3) for x in ("q", "k"))  # (N, H, T, hd)
    return {"q": q, "k": k, "bias": np.zeros_like(weights) if bias is None else bias, "weights": weights,
            "scale": float(model.blocks[layer].attn.scale)}  # fmt: skip


def _positional(r: dict[str, np.ndarray]) -> np.ndarray:
    """P by docs/positional.md's definition: c (Q K^T - G) / (N (N - 1)) + mean bias, G = sum_a q_a k_a^T."""
    q, k, c = r["q"], r["k"], r["scale"]
    n = q.shape[0]
    cross = np.einsum("hid,hjd->hij", q.sum(0), k.sum(0))
    same = np.einsum("ahid,ahjd->hij", q, k)
    return c * (cross - same) / (n * (n - 1)) + np.nan_to_num(r["bias"]).mean(0)


LOWER = np.tril(np.ones((T, T), bool))


@pytest.mark.parametrize(("scheme", "resolution"), [("alibi", T), ("cable", 16), ("rope", T), ("nope", 13),
                                                    ("fire", T)])  # fmt: skip
def test_scores_positional_logits_and_key_profile_equal_numpy_float64(tmp_path: Path, scheme: str,
                                                                      resolution: int) -> None:  # fmt: skip
    model = small_model(scheme)
    ids = _windows()
    r = _reference(model, ids, tmp_path, layer=1)
    extract_summary(BiasGPTAdapter(model, source="test"), ids, tmp_path / "sum.h5", layers=[1], resolution=resolution,
                    device="cpu", progress=False)  # fmt: skip
    scores = r["scale"] * np.einsum("ahid,ahjd->ahij", r["q"], r["k"]) + np.nan_to_num(r["bias"])
    scores[..., ~LOWER] = np.nan
    p = _positional(r)
    p[..., ~LOWER] = np.nan
    w = r["weights"]
    with h5py.File(tmp_path / "sum.h5") as f:
        g, b = f["layer_1"], f.attrs["block"]
        tol = {"rtol": 1e-5, "atol": 1e-5}
        np.testing.assert_allclose(g["scores_mean"][()], _block_means(scores.mean(0), b), equal_nan=True, **tol)
        np.testing.assert_allclose(g["scores_std"][()], _block_means(scores.std(0), b), equal_nan=True,
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(g["positional_mean"][()], _block_means(p, b), equal_nan=True, **tol)
        for h in range(p.shape[0]):  # P by distance, over all keys and over keys j >= 4
            for d in (0, 1, 7, T - 5, T - 1):
                cells = np.diagonal(p[h], -d)
                np.testing.assert_allclose(g["positional_profile"][0, h, d], cells.mean(), **tol)
                if d < T - 4:
                    np.testing.assert_allclose(g["positional_profile"][1, h, d], cells[4:].mean(), **tol)
                else:
                    assert np.isnan(g["positional_profile"][1, h, d])
        scores_by_d = np.stack([np.diagonal(scores, -d, axis1=-2, axis2=-1).mean(axis=(0, -1)) for d in range(T)], -1)
        np.testing.assert_allclose(g["scores_profile"][0], scores_by_d, **tol)
        # the weights by key: over samples and the T - j queries that see key j
        seen = [w[:, :, j:, j] for j in range(T)]  # (N, H, T - j) each
        np.testing.assert_allclose(g["weights_key_profile"][0], np.stack([s.mean(axis=(0, 2)) for s in seen], -1),
                                   **tol)  # fmt: skip
        np.testing.assert_allclose(g["weights_key_profile"][1], np.stack([s.std(axis=(0, 2)) for s in seen], -1),
                                   rtol=1e-4, atol=1e-5)  # fmt: skip
        np.testing.assert_allclose(g["sink_share"][()], w[:, :, :, 0].mean(-1), **tol)


CONTEXT_FREE = [s.name for s in TABLE if s.adds_bias and not s.context_dependent]  # every one the registry holds


def test_the_context_free_schemes_are_the_ones_the_zero_q_k_test_expects() -> None:
    assert {"alibi", "kerple-log", "kerple-power", "t5", "fire"} <= set(CONTEXT_FREE)


@pytest.mark.parametrize("scheme", CONTEXT_FREE)
def test_with_zero_q_and_k_the_positional_logits_are_the_bias(tmp_path: Path, scheme: str) -> None:
    model = small_model(scheme)
    with torch.no_grad():
        for block in model.blocks:
            c = block.attn.c_attn
            c.weight[: 2 * c.in_features].zero_()
            c.bias[: 2 * c.in_features].zero_()
    ids = _windows()
    adapter = BiasGPTAdapter(model, source="test")
    extract(adapter, ids, tmp_path / "full.h5", layers=[1], device="cpu", progress=False)
    extract_summary(adapter, ids, tmp_path / "sum.h5", layers=[1], resolution=T, device="cpu", progress=False)
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        b = full["layer_1/bias"][0].astype(np.float64)
        b[..., ~LOWER] = np.nan
        np.testing.assert_array_equal(summ["layer_1/positional_mean"][()], b.astype(np.float32))


def test_rope_positional_logits_are_the_long_term_decay_kernel_of_the_mean_vectors(tmp_path: Path) -> None:
    """Layer 0 on windows of one repeated token (a different token per window): q and k before the rotation do
    not depend on the position, so P(i, j) = c Re sum_f q~_f conj(k~_f) e^{i (i - j) theta_f} over pairs."""
    base = 500.0
    model = small_model("rope", scheme_options={"base": base})
    ids = np.repeat(np.array([[5], [17], [42], [80]]), T, axis=1)
    got: dict[str, torch.Tensor] = {}
    with capture(model, ["blocks.0.attn.hook_q", "blocks.0.attn.hook_k"],
                 lambda t, n, _r: got.update({n[-1]: t})), torch.no_grad():  # fmt: skip
        model(torch.from_numpy(ids))
    attn = model.blocks[0].attn
    hd = attn.head_dim
    half = hd // 2
    # position 0 is not rotated: these are q~ and k~ of every position, as complex pairs (f, f + hd/2)
    q0, k0 = (got[x][:, 0].double().numpy() for x in ("q", "k"))  # (N, H, hd)
    zq, zk = q0[..., :half] + 1j * q0[..., half:], k0[..., :half] + 1j * k0[..., half:]
    n = len(ids)
    pairs = np.einsum("ahf,bhf->hf", zq, np.conj(zk)) - np.einsum("ahf,ahf->hf", zq, np.conj(zk))  # a != b
    theta = base ** (-2.0 * np.arange(half) / hd)
    d = np.arange(T)[:, None] - np.arange(T)[None, :]
    kernel = np.real(np.einsum("hf,ijf->hij", pairs, np.exp(1j * d[..., None] * theta))) * attn.scale / (n * (n - 1))
    kernel[..., ~LOWER] = np.nan
    extract_summary(BiasGPTAdapter(model, source="test"), ids, tmp_path / "sum.h5", layers=[0], resolution=T,
                    device="cpu", progress=False)  # fmt: skip
    with h5py.File(tmp_path / "sum.h5") as f:
        np.testing.assert_allclose(f["layer_0/positional_mean"][()], kernel, rtol=1e-5, atol=1e-5, equal_nan=True)


def test_sink_share_and_sink_heads_as_gu_et_al_compute_them(tmp_path: Path) -> None:
    """Gu et al. (sail-sg/Attention-Sink, compute_attention_sink): a key's importance in one sample is
    sum_i w(i, j) / (T - j); a head is a sink head where key 0's exceeds epsilon = 0.3, counted per sample."""
    model = small_model("nope")
    attn, c = model.blocks[0].attn, model.config.n_embd
    hd = attn.head_dim
    with torch.no_grad():  # heads 0-3 of layer 0 turn to a BOS (token 0) at key 0: sink heads by construction
        model.embed.weight[0] = 0.0
        model.embed.weight[0, 0] = 50.0  # after ln_1 its dimension 0 stands out (about 9.7)
        rows = slice(0, 4 * hd)
        attn.c_attn.weight[rows] = 0.0
        attn.c_attn.bias[rows] = 1.0  # q: the same vector at every position
        attn.c_attn.weight[c : c + 4 * hd] = 0.0
        attn.c_attn.weight[c : c + 4 * hd, 0] = 0.5  # k: dimension 0 of the normalised input
        attn.c_attn.bias[c : c + 4 * hd] = 0.0
    ids = _windows(4, seed=3)
    ids[ids == 0] = 1
    ids[:, 0] = 0  # the BOS, at key 0 only
    adapter = BiasGPTAdapter(model, source="test")
    extract(adapter, ids, tmp_path / "full.h5", layers=[0], device="cpu", progress=False)
    extract_summary(adapter, ids, tmp_path / "sum.h5", layers=[0], resolution=T, device="cpu", progress=False)
    with h5py.File(tmp_path / "full.h5") as full, h5py.File(tmp_path / "sum.h5") as summ:
        w = full["layer_0/weights"][()].astype(np.float64)  # (N, H, T, T)
        ratios = np.arange(T, 0, -1)[None, None, None, :]  # T - j, along the keys
        importance = (w / ratios).sum(axis=-2)  # (N, H, T): their alpha_j per sample and head
        share = summ["layer_0/sink_share"][()]
        np.testing.assert_allclose(share, importance[..., 0], rtol=1e-5, atol=1e-6)
        their_metric = (importance[..., 0] > 0.3).mean()
        assert ((share > 0.3).mean()) == their_metric
        assert their_metric == pytest.approx(4 / 12)  # heads 0-3 in every sample, and no other
        np.testing.assert_allclose(summ["layer_0/weights_key_profile"][0], importance.mean(0), rtol=1e-5, atol=1e-6)


def test_one_sample_has_no_positional_logits_but_keeps_the_rest(tmp_path: Path) -> None:
    extract_summary(BiasGPTAdapter(small_model("rope"), source="test"), _windows(1), tmp_path / "one.h5",
                    layers=[1], resolution=16, device="cpu", progress=False)  # fmt: skip
    with h5py.File(tmp_path / "one.h5") as f:
        g = f["layer_1"]
        assert "positional_mean" not in g and "positional_profile" not in g
        assert {"scores_mean", "scores_std", "scores_profile", "weights_key_profile", "sink_share"} <= set(g)


def test_leaving_out_the_positional_logits_changes_nothing_else(tmp_path: Path) -> None:
    """``positional=False`` (to measure what P costs): no P, and every other dataset as with P, bit for bit."""
    adapter = BiasGPTAdapter(small_model("alibi"), source="test")
    for name, positional in (("with", True), ("without", False)):
        extract_summary(adapter, _windows(), tmp_path / f"{name}.h5", layers=[1], resolution=16, device="cpu",
                        progress=False, positional=positional)  # fmt: skip
    with h5py.File(tmp_path / "with.h5") as a, h5py.File(tmp_path / "without.h5") as b:
        kept = set(b["layer_1"])
        assert set(a["layer_1"]) - kept == {"positional_mean", "positional_profile", "positional_diagnostics",
                                            "positional_mean_se", "positional_profile_se"}  # fmt: skip
        for name in kept:
            np.testing.assert_array_equal(a["layer_1"][name][()], b["layer_1"][name][()], err_msg=name)
