"""P's profile and block map SEs of calls streamed as the model runs (docs/position-measures.md): GPT-2 (no bias; its
hooks stream the calls), a call whose float mask adds a bias by distance (the same in every sample) and one whose bias
depends on the text (the others' mean bias enters each delete-one P). The reference is the delete-one jackknife from
scratch: every P_(−a) formed again in float64 from the q, k, scale and additive part caught at the model's own SDPA
call, its profile over all keys and over keys j >= 4, and its block means over the causal cells."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

import biasviz
from tests.summaries.test_sample_cells import caught_call

T, N, HEADS, VOCAB = 16, 4, 4, 64


def _profile(q: np.ndarray, k: np.ndarray, c: float, added: np.ndarray) -> np.ndarray:
    """(2, H, T): P of these samples (mean over ordered pairs of different texts of c q_a·k_b, plus the mean bias) by
    distance over the causal cells, over all keys and over keys j >= 4."""
    n = len(q)
    p = np.mean([c * np.einsum("hid,hjd->hij", q[a], k[b]) for a in range(n) for b in range(n) if a != b], axis=0)
    p = p + added.mean(0)
    d = np.subtract.outer(np.arange(T), np.arange(T))
    late = np.arange(T)[None, :] >= 4
    out = np.full((2, p.shape[0], T), np.nan)
    for dist in range(T):
        out[0, :, dist] = p[:, d == dist].mean(-1)
        if ((d == dist) & late).any():
            out[1, :, dist] = p[:, (d == dist) & late].mean(-1)
    return out


def _p(q: np.ndarray, k: np.ndarray, c: float, added: np.ndarray) -> np.ndarray:
    """(H, T, T): P of these samples, c (Q·K − G) / (N (N − 1)) + the mean additive part."""
    n = len(q)
    cross = np.einsum("hid,hjd->hij", q.sum(0), k.sum(0)) - np.einsum("ahid,ahjd->hij", q, k)
    return c * cross / (n * (n - 1)) + added.mean(0)


def _mean_jackknife(call: dict[str, Any], block: int) -> np.ndarray:
    """(H, nb, nb): the delete-one jackknife SE of P's block means over the attended cells (the same in every
    sample)."""
    q, k, c, added = call["q"], call["k"], float(call["scale"]), call["added"]
    n, nb = len(q), -(-T // block)
    causal = call["kept"][0, 0]
    assert (call["kept"] == causal).all()
    left = []
    for a in range(n):
        p = _p(*(np.delete(x, a, 0) for x in (q, k)), c, np.delete(added, a, 0))
        means = np.full((p.shape[0], nb, nb), np.nan)
        for qb in range(nb):
            for kb in range(nb):
                cells = np.zeros((T, T), bool)
                cells[qb * block : (qb + 1) * block, kb * block : (kb + 1) * block] = True
                cells &= causal
                if cells.any():
                    means[:, qb, kb] = p[:, cells].mean(-1)
        left.append(means)
    th = np.stack(left)
    return np.sqrt((n - 1) / n * ((th - th.mean(0)) ** 2).sum(0))


def _jackknife(call: dict[str, Any]) -> np.ndarray:
    q, k, c, added = call["q"], call["k"], float(call["scale"]), call["added"]
    n = len(q)
    left = np.stack([_profile(*(np.delete(x, a, 0) for x in (q, k)), c, np.delete(added, a, 0)) for a in range(n)])
    return np.sqrt((n - 1) / n * ((left - left.mean(0)) ** 2).sum(0))


class TextBias(torch.nn.Module):
    """One SDPA call whose float mask adds a bias by distance and (``text``) by each key's token: it differs by text."""

    def __init__(self, text: bool = True, window: int = T) -> None:
        super().__init__()
        self.text, self.window = text, window
        self.embed = torch.nn.Embedding(VOCAB, HEADS * 8)
        self.k = torch.nn.Linear(HEADS * 8, HEADS * 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        q = x.view(*ids.shape, HEADS, 8).transpose(1, 2)
        k = self.k(x).view(*ids.shape, HEADS, 8).transpose(1, 2)
        t = ids.shape[-1]
        i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
        bias = -0.1 * (i - j).float() + 0.3 * self.text * (ids[:, None, None, :] % 5).float()  # (B, 1, 1, T) + (T, T)
        mask = torch.where((j <= i) & (i - j < self.window), bias, float("-inf"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, k, attn_mask=mask)


def _check(out: Path, call: dict[str, Any], layer: int, mean: bool = True) -> None:
    """P's profile SE, and (``mean``) its block map's, shaped like their means, against the jackknife from scratch."""
    with h5py.File(out, "r") as f:
        g = f[f"layer_{layer}"]
        got = g["positional_profile_se"][()]
        assert got.shape == g["positional_profile"].shape
        if mean:
            block = int(f.attrs["block"])
            got_mean = g["positional_mean_se"][()]
            assert got_mean.shape == g["positional_mean"].shape
            np.testing.assert_allclose(got_mean, _mean_jackknife(call, block), rtol=1e-3, atol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got, _jackknife(call), rtol=2e-4, atol=1e-7, equal_nan=True)


def _text_bias(tmp_path: Path, seed: int, batch: int, resolution: int | None = None,
               **options: Any) -> tuple[Path, dict[str, Any]]:  # fmt: skip
    """A TextBias model's own call (caught) and its summary, in batches of ``batch``."""
    torch.manual_seed(0)
    model = TextBias(**options).eval()
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(seed))
    call = caught_call(lambda: model(ids))
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False, batch_size=batch, resolution=resolution)
    return out, call


@pytest.mark.parametrize("resolution", [T, T // 4])
def test_a_text_dependent_bias_enters_the_streamed_jackknife(tmp_path: Path, resolution: int) -> None:
    """Each sample's bias enters its delete-one P: by distance for the profile's SE, by its sums over each block for
    the block map's."""
    out, call = _text_bias(tmp_path, 5, 2, resolution)
    _check(out, call, 0)


def test_a_text_dependent_bias_in_a_sliding_window_enters_p_s_block_map_se(tmp_path: Path) -> None:
    """The same over a window of five keys (the call's own mask): each sample's bias summed over each block's attended
    cells."""
    out, call = _text_bias(tmp_path, 5, 3, T // 4, window=5)
    with h5py.File(out, "r") as f:
        got = f["layer_0/positional_mean_se"][()]
        assert got.shape == f["layer_0/positional_mean"].shape
    np.testing.assert_allclose(got, _mean_jackknife(call, 4), rtol=1e-3, atol=1e-6, equal_nan=True)


def test_a_text_dependent_bias_past_the_memory_for_its_block_sums_leaves_the_map_without_se(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each sample's bias sums by block not kept (past their memory): P's block map has no SE, and the layer's note
    says why; its profile's SE is there."""
    import biasviz.summaries.positional_errors as errors

    monkeypatch.setattr(errors, "BIAS_BLOCKS_BYTES", 0)
    out, call = _text_bias(tmp_path, 5, 2)
    _check(out, call, 0, mean=False)
    with h5py.File(out, "r") as f:
        assert "positional_mean_se" not in f["layer_0"] and "positional_mean" in f["layer_0"]
        assert "differs by sample" in f["layer_0"].attrs["note"] and "block map" in f["layer_0"].attrs["note"]


@pytest.mark.parametrize("resolution", [T, T // 4])
def test_a_bias_by_distance_streamed_has_p_s_block_map_se(tmp_path: Path, resolution: int) -> None:
    """A float mask adding the same bias to every sample (streamed): P's block map SE per cell and in blocks of four,
    each sample's rows formed again from the q and k kept for it."""
    out, call = _text_bias(tmp_path, 8, 3, resolution, text=False)
    _check(out, call, 0)


def test_gpt2_streamed_by_its_hooks_has_p_s_profile_se(tmp_path: Path) -> None:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_embd=32, n_head=HEADS, n_layer=1, vocab_size=VOCAB, n_positions=64, bos_token_id=0,
                        eos_token_id=0, attn_implementation="sdpa")  # fmt: skip
    model = GPT2LMHeadModel(config).eval()
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(6))
    call = caught_call(lambda: model(ids))
    model.save_pretrained(tmp_path / "gpt2")
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(str(tmp_path / "gpt2"), ids.numpy(), out, summary=True, progress=False)
    _check(out, call, 0)


def test_opt_formed_again_without_rotation_has_p_s_profile_se(tmp_path: Path) -> None:
    """OPT (learned absolute positions, SDPA, rows formed again): P's profile SE though no rotary pair splits it."""
    from transformers import OPTConfig, OPTForCausalLM

    torch.manual_seed(0)
    config = OPTConfig(hidden_size=32, num_attention_heads=HEADS, num_hidden_layers=1, ffn_dim=64, vocab_size=VOCAB,
                       max_position_embeddings=64, word_embed_proj_dim=32, attn_implementation="sdpa")  # fmt: skip
    model = OPTForCausalLM(config).eval()
    ids = torch.randint(2, VOCAB, (N, T), generator=torch.Generator().manual_seed(7))
    call = caught_call(lambda: model(ids))
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        biasviz.extract(model, ids, out, summary=True, progress=False)
    with h5py.File(out, "r") as f:
        assert "positional_mean_se" in f["layer_0"] and "frequency_use" not in f["layer_0"]
    _check(out, call, 0)
