"""Heads folded into the batch with no view of the scores to say so (:mod:`biasviz.tracing.folds`): fairseq's attention
in an encoder, which adds no mask, multiplies q and k of (B·H, T, d); its calls hold H heads a sample, as the model's
own weights say, where they read as one head of B·H samples (FSMT's and MVP's encoders ended in the writer's
"weights of layer 0 has shape (4, 1, 48, 48)")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

import biasviz
from biasviz.tracing.folds import FoldedHeads


def test_a_fold_is_noted_and_carried_through_the_steps_before_the_product() -> None:
    folds = FoldedHeads()
    x = torch.randn(2, 4, 5, 8)
    flat = x.reshape(8, 5, 8)
    folds.after("reshape", (x, 8, 5, 8), {}, flat)
    kt = flat.transpose(1, 2)
    folds.after("transpose", (flat, 1, 2), {}, kt)
    scaled = flat * 0.5
    folds.after("__mul__", (flat, 0.5), {}, scaled)
    assert (folds.heads(flat), folds.heads(kt), folds.heads(scaled)) == (4, 4, 4)
    same = x[:, :1].reshape(2, 5, 8)  # one head: nothing folded
    folds.after("reshape", (x[:, :1], 2, 5, 8), {}, same)
    other = flat.sum(0, keepdim=True).expand(8, 5, 8)  # a step that mixes the batch: not carried
    folds.after("sum", (flat,), {}, other)
    assert folds.heads(same) is None and folds.heads(other) is None and folds.heads(x) is None


class FairseqEncoderAttention(nn.Module):
    """fairseq's self-attention with no mask to add: q scaled, q and k reshaped to (B·H, T, d), bmm, softmax."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.hd = heads, dim // heads
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))

    def fold(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.heads, self.hd).transpose(1, 2).reshape(b * self.heads, n, self.hd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, dim = x.shape
        q, k, v = self.fold(self.q(x) * self.hd**-0.5), self.fold(self.k(x)), self.fold(self.v(x))
        w = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        return self.o(torch.bmm(w, v).view(b, self.heads, n, self.hd).transpose(1, 2).reshape(b, n, dim))


def test_an_encoder_call_of_folded_heads_holds_its_heads() -> None:
    torch.manual_seed(0)
    model = FairseqEncoderAttention().eval()
    x = torch.randn(3, 7, 16)
    with biasviz.trace(model) as t, torch.no_grad():
        model(x)
    (call,) = t.calls
    assert (call.batch, call.heads, call.q_len, call.k_len, call.causal) == (3, 4, 7, 7, False)
    xd = x.double()
    p = {name: getattr(model, name) for name in "qk"}
    q = (xd @ p["q"].weight.double().T + p["q"].bias.double()) * 4**-0.5
    k = xd @ p["k"].weight.double().T + p["k"].bias.double()
    q, k = (m.view(3, 7, 4, 4).transpose(1, 2) for m in (q, k))
    want = torch.softmax(q @ k.transpose(-1, -2), dim=-1).detach()
    np.testing.assert_allclose(t.weights[0].double().numpy(), want.numpy(), rtol=0, atol=1e-6)


def test_fsmt_s_encoder_calls_are_its_heads(tmp_path: Path) -> None:
    """FSMT (fairseq's WMT translation models): every call, the encoder's included, as transformers' own eager
    ``output_attentions`` gives it, in a full file of every call."""
    import h5py
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    config = FSMTConfig(src_vocab_size=64, tgt_vocab_size=64, d_model=16, encoder_layers=1, decoder_layers=1,
                        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=32, decoder_ffn_dim=32,
                        max_position_embeddings=32, langs=["en", "de"], pad_token_id=1, decoder_start_token_id=2)
    torch.manual_seed(0)
    FSMTForConditionalGeneration(config).save_pretrained(tmp_path / "fsmt")
    ids = np.random.default_rng(0).integers(3, 60, size=(2, 10))
    biasviz.extract(tmp_path / "fsmt", ids, tmp_path / "f.h5", layers="all", progress=False)
    model = FSMTForConditionalGeneration.from_pretrained(tmp_path / "fsmt", attn_implementation="eager").eval()
    shifted = torch.from_numpy(np.hstack([np.full((2, 1), 2), ids[:, :-1]]))
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(ids), decoder_input_ids=shifted, output_attentions=True,
                    use_cache=False)  # fmt: skip
    want = [out.encoder_attentions[0], out.decoder_attentions[0], out.cross_attentions[0]]
    with h5py.File(tmp_path / "f.h5") as f:
        assert f.attrs["n_heads"] == 4
        for call, expected in enumerate(want):
            np.testing.assert_allclose(f[f"layer_{call}/weights"][...], expected.numpy(), rtol=0, atol=1e-6)
