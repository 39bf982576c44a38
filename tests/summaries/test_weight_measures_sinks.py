"""Sink keys ranked among the keys enough queries see, and secondary sinks only where a key other than key 0 holds
at least epsilon = 0.3 of the weight (docs/position-measures.md, 'Sink keys'), against float64 references formed
from the model's own weights: q and k caught at its attention call, its ALiBi slopes, its encoder's bias."""

from __future__ import annotations

import json
import math
from pathlib import Path

import h5py
import numpy as np
import torch
import torch.nn.functional as F

import biasviz
from biasviz.cli import main
from tests.conftest import small_model
from tests.measures_reference import sink_ranking
from tests.summaries.test_weight_measures_models import hooked_qk

EPSILON = 0.3


def softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(N, H, T, T) softmax over the attended cells ``mask`` (T, T), 0 elsewhere."""
    z = np.where(mask, logits, -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def received(w: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(N, H, T, T) weights, (T, T) attended cells -> (N, H, T) each key's weight averaged over the queries that
    see it."""
    return np.where(mask, w, 0.0).sum(-2) / mask.sum(0)


def diagnosed(path: Path) -> dict:
    out = path.parent / "d.json"
    try:
        main(["diagnose", str(path), "--no-figures", "--json", str(out)])
    except SystemExit as exc:
        assert not exc.code, exc.code
    return next(iter(json.loads(out.read_text())["schemes"].values()))["sinks"]


def test_the_last_keys_of_a_causal_model_do_not_rank_by_construction(tmp_path: Path) -> None:
    """ALiBi's steep heads: the last query attends locally, so the last key (seen by it alone) receives most of its
    weight. Ranked over every key it would come first; ranked among the keys seen by at least ceil(T / 8) = 4
    queries it cannot, and the file, its mean ranking and diagnose's secondary sinks are the reference's."""
    n, t, layer = 2, 32, 1
    model = small_model("alibi")
    ids = np.random.default_rng(4).integers(0, 97, size=(n, t))
    q, k = hooked_qk(model, layer, ids)
    attn = model.blocks[layer].attn
    slopes = attn.pos_bias.slopes.double().numpy()
    d = np.subtract.outer(np.arange(t), np.arange(t)).astype(np.float64)
    mask = d >= 0
    logits = float(attn.scale) * np.einsum("nhid,nhjd->nhij", q, k) - slopes[None, :, None, None] * d
    w = softmax(logits, mask)
    got_by_key = received(w, mask)
    assert (got_by_key.argmax(-1) >= t - 3).sum() >= 8  # without the rule: the last keys on top in most heads
    out = tmp_path / "alibi.h5"
    biasviz.extract(model, ids, out, layers=[layer], summary=True, device="cpu", progress=False)
    seen = np.broadcast_to(mask.sum(0), (12, t))
    index, share, least = sink_ranking(got_by_key, seen)
    assert (least == math.ceil(t / 8)).all()
    with h5py.File(out) as f:
        stored = f[f"layer_{layer}/sink_keys"]
        np.testing.assert_array_equal(stored["index"], index)
        np.testing.assert_allclose(stored["share"], share, rtol=2e-5, atol=1e-7)
        assert stored.attrs["sink_min_queries"] == 4
    mean_index, mean_share, _ = sink_ranking(got_by_key.mean(0, keepdims=True), seen)
    sinks = diagnosed(out)
    assert [[r["key"] for r in row] for row in sinks["top_keys_per_head"]] == mean_index[0].tolist()
    expected = [h for h in range(12) if mean_index[0, h, 0] != 0 and mean_share[0, h, 0] >= EPSILON]
    assert sinks["secondary_sink_heads"] == expected  # head indices from 0
    assert max(r["key"] for row in sinks["top_keys_per_head"] for r in row) <= t - 4
    assert sinks["sink_min_queries"] == 4


class NearUniform(torch.nn.Module):
    """One bidirectional attention call of near-uniform weights: tiny q and k, and a bias that favours key 3 by a
    twentieth of a logit, so key 3 ranks first with a share of about 1/T."""

    heads, width, seq_len, vocab = 2, 4, 12, 16

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(self.vocab, self.heads * self.width)
        with torch.no_grad():
            self.embed.weight.mul_(0.01)
        bias = torch.zeros(self.heads, self.seq_len, self.seq_len)
        bias[:, :, 3] = 0.05
        self.register_buffer("bias", bias)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids).view(ids.shape[0], self.seq_len, self.heads, self.width).transpose(1, 2)
        return F.scaled_dot_product_attention(x, x, x, attn_mask=self.bias[None])


def test_a_near_uniform_head_has_no_secondary_sink(tmp_path: Path) -> None:
    """Every key qualifies in a bidirectional call (T queries see each); the top key is key 3, not key 0, but with
    a share near 1/T, far below epsilon: no secondary sink, from the mean or in any sample."""
    torch.manual_seed(0)
    model = NearUniform().eval()
    t, heads = model.seq_len, model.heads
    ids = torch.randint(0, model.vocab, (3, t), generator=torch.Generator().manual_seed(1))
    x = model.embed.weight.detach().double()[ids].numpy().reshape(3, t, heads, model.width).transpose(0, 2, 1, 3)
    logits = np.einsum("nhid,nhjd->nhij", x, x) / math.sqrt(model.width) + model.bias.double().numpy()[None]
    mask = np.ones((t, t), bool)
    w = softmax(logits, mask)
    by_key = received(w, mask)
    index, share, least = sink_ranking(by_key.mean(0, keepdims=True), np.full((heads, t), t))
    assert (index[0, :, 0] == 3).all() and (share[0, :, 0] < 2 / t).all()  # near-uniform, key 3 on top
    out = tmp_path / "uniform.h5"
    biasviz.extract(model, ids, out, summary=True, progress=False)
    with h5py.File(out) as f:
        assert f.attrs["mask"] == "bidirectional"
        stored = f["layer_0/sink_keys"]
        each, each_share, _ = sink_ranking(by_key, np.full((heads, t), t))
        np.testing.assert_array_equal(stored["index"][..., 0], each[..., 0])  # past rank 0: ties within float32
        np.testing.assert_allclose(stored["share"], each_share, rtol=2e-5)
        min_queries = stored.attrs.get("sink_min_queries")
    sinks = diagnosed(out)
    assert sinks["secondary_sink_heads"] == []
    assert [row[0]["key"] for row in sinks["top_keys_per_head"]] == [3] * heads
    assert sinks["samples_with_secondary_sink_per_head"] == [0.0] * heads
    assert min_queries == math.ceil(t / 8) == least[0]
