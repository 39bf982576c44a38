"""A flex_attention ``score_mod`` that softcaps (cap·tanh(s / cap)) is a step after q and k (docs/hdf5.md, 'Attended
cells'): the summary keeps P from q and k and the scores before the cap, the weights are the capped softmax's, and the
layer's note says what the call did beyond. The reference is float64 math on q and k recomputed from the module's own
weights."""

from __future__ import annotations

import warnings
from pathlib import Path

import h5py
import numpy as np
import torch

import biasviz

T, N, HEADS, DIM, VOCAB, CAP = 16, 4, 4, 8, 64, 2.0


def _causal(b, h, q, kv):  # noqa: ANN001, ANN202 - flex's mask_mod signature
    return kv <= q


def _softcap(score, b, h, q, kv):  # noqa: ANN001, ANN202 - flex's score_mod signature
    return CAP * torch.tanh(score / CAP)


class Softcapped(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HEADS * DIM)
        self.q, self.k = torch.nn.Linear(HEADS * DIM, HEADS * DIM), torch.nn.Linear(HEADS * DIM, HEADS * DIM)

    def operands(self, ids: torch.Tensor, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(ids).to(dtype)
        q = torch.nn.functional.linear(x, self.q.weight.to(dtype), self.q.bias.to(dtype))
        k = torch.nn.functional.linear(x, self.k.weight.to(dtype), self.k.bias.to(dtype))
        return tuple(z.view(*ids.shape, HEADS, DIM).transpose(1, 2) for z in (q, k))  # type: ignore[return-value]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        q, k = self.operands(ids)
        mask = create_block_mask(_causal, None, None, ids.shape[-1], ids.shape[-1], device="cpu")
        return flex_attention(q, k, k, score_mod=_softcap, block_mask=mask)


def test_a_softcapping_score_mod_keeps_p_from_q_and_k_and_says_so(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Softcapped().eval()
    ids = torch.randint(0, VOCAB, (N, T), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        q, k = (z.numpy() for z in model.operands(ids, torch.float64))
    c = DIM**-0.5
    keep = np.tril(np.ones((T, T), dtype=bool))
    nan = np.where(keep, 1.0, np.nan)
    scores = c * np.einsum("nhid,nhjd->nhij", q, k)
    z = np.where(keep, CAP * np.tanh(scores / CAP), -np.inf)
    w = np.exp(z - z.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    pairs = [(a, b) for a in range(N) for b in range(N) if a != b]
    p = np.mean([c * np.einsum("hid,hjd->hij", q[a], k[b]) for a, b in pairs], axis=0) * nan
    d = np.subtract.outer(np.arange(T), np.arange(T))
    profile = np.full((2, HEADS, T), np.nan)
    for dist in range(T):
        profile[0, :, dist] = p[:, d == dist].mean(-1)
        late = (d == dist) & (np.arange(T)[None, :] >= 4)
        if late.any():
            profile[1, :, dist] = p[:, late].mean(-1)
    out = tmp_path / "s.h5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # flex's note that it runs unfused, and the call's own
        biasviz.extract(model, ids, out, summary=True, progress=False)
    with h5py.File(out, "r") as f:
        g = f["layer_0"]
        np.testing.assert_allclose(g["positional_mean"][()], p, rtol=2e-5, atol=2e-6, equal_nan=True)
        np.testing.assert_allclose(g["positional_profile"][()], profile, rtol=2e-5, atol=2e-6, equal_nan=True)
        np.testing.assert_allclose(g["scores_mean"][()], scores.mean(0) * nan, rtol=2e-5, atol=2e-6, equal_nan=True)
        np.testing.assert_allclose(g["weights_mean"][()], w.mean(0) * nan, rtol=2e-5, atol=2e-6, equal_nan=True)
        note = g.attrs["note"]
        assert "score_mod is not additive" in note and "positional logits are scale·q·kᵀ before that step" in note
        assert "layer_0/bias_mean" not in f
