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


@pytest.mark.parametrize("joint", [False, True])
def test_key_profile_counts_the_cells_each_block_brings(joint: bool) -> None:
    """The key profile's mean and spread by key over every (sample, query) pair that sees the key, against numpy:
    samples 0-2 in blocks that bring no cells (the causal triangle), samples 3-5 in blocks with their own (left
    padding of 0, 2 and 5): nothing set on the profile between them. ``joint``: a one-mask call's per-cell moments
    (one block for every sample, over the mask's rows), as rows formed again give them."""
    from biasviz.summaries.position import KeyProfile

    n, h, t, rows = 6, 2, 9, 4
    rng = np.random.default_rng(5)
    causal = np.tril(np.ones((t, t), bool))
    masks = np.stack([causal] * n)
    if joint:  # one mask for every sample: a window of 3
        masks[:] = causal & ~np.tril(np.ones((t, t), bool), -3)
    else:
        for a, pad in zip((3, 4, 5), (0, 2, 5), strict=True):
            masks[a, :, :pad] = False
            masks[a, :pad] = False
    w = np.where(masks[:, None], rng.random((n, h, t, t)), 0.0)
    profile = KeyProfile(h, t, torch.device("cpu"))
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        if joint:
            block = w[:, :, r0:r1, :r1]
            moments = torch.as_tensor(np.stack([block.mean(0), block.std(0)]))
            profile.add(moments, torch.as_tensor(masks[:1, None, r0:r1, :r1]), r0)
            continue
        for first, own in ((0, False), (3, True)):
            cells = torch.as_tensor(masks[first : first + 3, None, r0:r1, :r1]) if own else None
            profile.add_samples(torch.as_tensor(w[first : first + 3, :, r0:r1, :r1]), n, cells, r0)
    got = profile.result().numpy()
    for head in range(h):
        for j in range(t):
            seen = [w[a, head, i, j] for a in range(n) for i in range(t) if masks[a, i, j]]
            want = (np.mean(seen), np.std(seen)) if seen else (np.nan, np.nan)
            np.testing.assert_allclose(got[:, head, j], want, rtol=1e-5, atol=1e-7, err_msg=f"head {head}, key {j}")


@pytest.mark.parametrize("joint", [False, True])
def test_key_profile_of_one_sample_in_float32_has_no_spread_where_one_query_sees_a_key(joint: bool) -> None:
    """One sample's float32 weights: the last key, seen by the last query alone, has a spread over queries of exactly
    0 (its square and its mean's square formed alike, in float64), whether it comes as per-cell moments (``joint``) or
    as the sample's own weights."""
    from biasviz.summaries.position import KeyProfile

    h, t = 3, 11
    rng = np.random.default_rng(3)
    w = torch.from_numpy(np.tril(rng.uniform(0.3, 0.9, (1, h, t, t)))).float()
    profile = KeyProfile(h, t, torch.device("cpu"))
    if joint:
        profile.add(torch.cat([w, torch.zeros_like(w)]), None, 0)
    else:
        profile.add_samples(w, 1, None, 0)
    got = profile.result()
    np.testing.assert_allclose(got[0, :, -1].numpy(), w[0, :, -1, -1].double().numpy(), rtol=0, atol=0)
    assert got[1, :, -1].tolist() == [0.0] * h


def test_key_profile_squares_a_block_a_few_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of per-cell moments larger than a step (here 2 heads x 7 keys, a step of 20 cells: 1 row) is squared
    a step of rows at a time: the same mean and spread by key as numpy's over the block's cells."""
    import biasviz.summaries.position as position

    monkeypatch.setattr(position, "WIDE_CELLS", 20)
    h, t = 2, 7
    rng = np.random.default_rng(11)
    mean, std = np.tril(rng.uniform(0.1, 0.9, (2, h, t, t)))
    profile = position.KeyProfile(h, t, torch.device("cpu"))
    profile.add(torch.from_numpy(np.stack([mean, std])).float(), None, 0)
    got = profile.result().numpy()
    mean, std = mean.astype(np.float32).astype(np.float64), std.astype(np.float32).astype(np.float64)
    for j in range(t):
        seen = slice(j, t)  # the queries i >= j
        want_mean = mean[:, seen, j].mean(-1)
        want_std = np.sqrt((std[:, seen, j] ** 2 + mean[:, seen, j] ** 2).mean(-1) - want_mean**2)
        np.testing.assert_allclose(got[:, :, j], [want_mean, want_std], rtol=1e-6, atol=1e-7, err_msg=f"key {j}")
