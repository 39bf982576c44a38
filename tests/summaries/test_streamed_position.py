"""docs/positional.md for models whose rows cannot be formed again, from what they stream: a transformers Llama in
eager attention (the scores followed from its product), DeBERTa-v2 (bidirectional, its relative terms the
additive part) and torch's MultiheadAttention (q and k from its in-projection, a float mask as the bias).
Scores, P, the key profile and sink shares in a summary at R = T against numpy float64 from the models' own q
and k (forward hooks, transformers' own rotation; DeBERTa's own projections and bias method)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import torch

import biasviz
from tests.summaries.test_position import LOWER, T
from tests.summaries.test_position_traced import HEADS, N, _reference, llama_dir  # noqa: F401 (a fixture)
from tests.tracing.test_eager_reshapes import deberta, relative_terms_float64

TOL = {"rtol": 1e-5, "atol": 1e-5}


def positional(q: np.ndarray, k: np.ndarray, c: float, bias: np.ndarray | None) -> np.ndarray:
    """P(i, j) = c·(Q(i)·K(j) − G(i, j)) / (N(N − 1)) + mean_a b_a(i, j), from its definition."""
    n = len(q)
    cross = np.einsum("hid,hjd->hij", q.sum(0), k.sum(0)) - np.einsum("ahid,ahjd->hij", q, k)
    return c * cross / (n * (n - 1)) + (0.0 if bias is None else bias.mean(0))


def test_eager_llama_summary_has_the_positional_logits_of_its_rotated_q_and_k(llama_dir: Path,  # noqa: F811
                                                                             tmp_path: Path) -> None:  # fmt: skip
    from transformers import LlamaForCausalLM

    ids = np.random.default_rng(1).integers(0, 100, size=(N, T))
    r = _reference(llama_dir, ids, layer=1)
    model = LlamaForCausalLM.from_pretrained(llama_dir, attn_implementation="eager").eval()
    biasviz.extract(model, ids, tmp_path / "sum.h5", layers=[1], summary=True, resolution=T, batch_size=2,
                    device="cpu", progress=False)  # fmt: skip
    c = r["scale"]
    scores = c * np.einsum("ahid,ahjd->ahij", r["q"], r["k"])
    masked = np.where(LOWER, scores, -np.inf)
    w = np.exp(masked - masked.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    p = np.where(LOWER, positional(r["q"], r["k"], c, None), np.nan)
    with h5py.File(tmp_path / "sum.h5") as f:
        g = f["layer_1"]
        np.testing.assert_allclose(g["scores_mean"][()], np.where(LOWER, scores, np.nan).mean(0), equal_nan=True,
                                   **TOL)  # fmt: skip
        np.testing.assert_allclose(g["positional_mean"][()], p, equal_nan=True, **TOL)
        seen = [w[:, :, j:, j] for j in range(T)]
        np.testing.assert_allclose(g["weights_key_profile"][0], np.stack([s.mean(axis=(0, 2)) for s in seen], -1),
                                   **TOL)  # fmt: skip
        np.testing.assert_allclose(g["sink_share"][()], w[:, :, :, 0].mean(-1), **TOL)


def test_deberta_summary_positional_logits_include_its_relative_terms(tmp_path: Path) -> None:
    """Bidirectional, with c2p + p2c added: P is the cross-text part of q·kᵀ plus the mean relative terms."""
    import copy

    from tests.tracing.test_eager_reshapes import IDS

    model = deberta(2)
    ids = IDS.numpy()
    n, t = ids.shape
    biasviz.extract(model, ids, tmp_path / "sum.h5", layers=[1], summary=True, resolution=t, device="cpu",
                    progress=False)  # fmt: skip
    twin = copy.deepcopy(model).double()
    seen: dict[int, torch.Tensor] = {}
    attention = twin.encoder.layer[1].attention.self
    attention.register_forward_pre_hook(lambda m, a: seen.__setitem__(1, a[0]))
    with torch.no_grad():
        twin(IDS)
        q, k = (attention.transpose_for_scores(proj(seen[1]), 4).view(n, 4, t, 16).numpy()
                for proj in (attention.query_proj, attention.key_proj))  # fmt: skip
    terms = relative_terms_float64(model, IDS, None)[1].view(n, 4, t, t).numpy()
    c = 1 / np.sqrt(16 * 3)
    scores = c * np.einsum("ahid,ahjd->ahij", q, k) + terms
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    with h5py.File(tmp_path / "sum.h5") as f:
        g = f["layer_1"]
        np.testing.assert_allclose(g["bias_mean"][()], terms.mean(0), **TOL)
        np.testing.assert_allclose(g["scores_mean"][()], scores.mean(0), **TOL)
        np.testing.assert_allclose(g["positional_mean"][()], positional(q, k, c, terms), **TOL)
        np.testing.assert_allclose(g["weights_key_profile"][0], w.mean(axis=(0, 2)), **TOL)
        np.testing.assert_allclose(g["sink_share"][()], w[:, :, :, 0].mean(-1), **TOL)


class MHAModel(torch.nn.Module):
    """torch's MultiheadAttention over embeddings, with an ALiBi-like float mask (a bias, no causal mask)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 32)
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)
        i = torch.arange(T, dtype=torch.float32)
        self.register_buffer("mask", -0.25 * (i[:, None] - i[None, :]).abs())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        return self.attn(x, x, x, attn_mask=self.mask, need_weights=False)[0]


def test_torch_multihead_attention_summary_positional_logits(tmp_path: Path) -> None:
    torch.manual_seed(4)
    model = MHAModel().eval()
    ids = np.random.default_rng(3).integers(0, 100, size=(N, T))
    biasviz.extract(model, ids, tmp_path / "sum.h5", layers=[0], summary=True, resolution=T, batch_size=2,
                    device="cpu", progress=False)  # fmt: skip
    with torch.no_grad():
        x = model.embed(torch.from_numpy(ids)).double()
        w, b = model.attn.in_proj_weight.double(), model.attn.in_proj_bias.double()
        q, k, _ = (x @ w.T + b).split(32, dim=-1)
        q, k = (z.view(N, T, 4, 8).transpose(1, 2).numpy() for z in (q, k))
    c, bias = 1 / np.sqrt(8), model.mask.double().numpy()
    scores = c * np.einsum("ahid,ahjd->ahij", q, k) + bias
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    with h5py.File(tmp_path / "sum.h5") as f:
        g = f["layer_0"]
        np.testing.assert_allclose(g["scores_mean"][()], scores.mean(0), **TOL)
        np.testing.assert_allclose(g["positional_mean"][()], positional(q, k, c, np.broadcast_to(bias, scores.shape)),
                                   **TOL)  # fmt: skip
        np.testing.assert_allclose(g["weights_key_profile"][0], weights.mean(axis=(0, 2)), **TOL)
        np.testing.assert_allclose(g["sink_share"][()], weights[:, :, :, 0].mean(-1), **TOL)


def test_samples_masked_differently_count_the_cells_each_block_brings() -> None:
    """The cells some sample attends and the samples per cell, from blocks of rows: a first batch under the call's one
    mask, then batches whose samples (and heads) attend cells of their own; counted here cell by cell."""
    import numpy as np
    import torch

    from biasviz.adapters.rows import RowBlock
    from biasviz.summaries.attended import Attended
    from biasviz.summaries.streamed_position import StreamedPosition

    heads, t, block, n = 2, 11, 3, 5
    rng = np.random.default_rng(4)
    i, j = np.indices((t, t))
    window = (j <= i) & (i - j < 5)
    cells = np.broadcast_to(window, (n, heads, t, t)).copy()
    cells[2:] = (j <= i) & (rng.random((n - 2, heads, t, t)) < 0.4)  # the later samples' own, head by head
    spot = StreamedPosition(0, heads=heads, seq_len=t, samples=n, block=block, causal=True,
                            device=torch.device("cpu"), positional=False, measures=False)  # fmt: skip
    spot.attend(Attended(torch.from_numpy(window)[None]))
    for first, size in ((0, 2), (2, 3)):
        spot.begin_batch(size)
        if first:
            spot.by_sample(first)
        for r0, r1 in ((0, 4), (4, t)):
            own = torch.from_numpy(window[None, None, r0:r1, :r1]) if first == 0 else torch.from_numpy(
                cells[first : first + size, :, r0:r1, :r1])  # fmt: skip
            weights = torch.zeros(size, heads, r1 - r0, r1, dtype=torch.float64)
            spot.add_block(RowBlock(0, first, r0, weights, attended=own))
    expected_union = cells.any(0)
    np.testing.assert_array_equal(spot.union.expand(heads, -1, -1).numpy(), expected_union)
    nb = -(-t // block)
    sums = np.zeros((heads, nb, nb))
    for qb in range(nb):
        for kb in range(nb):
            sums[:, qb, kb] = cells[:, :, qb * block : (qb + 1) * block, kb * block : (kb + 1) * block].sum((0, 2, 3))
    np.testing.assert_array_equal(spot.cell_samples.expand(heads, -1, -1).numpy(), sums)


def test_p_is_formed_from_every_sample_s_q_and_k_or_not_at_all() -> None:
    """Three samples streamed a call each, whole: where each brought its q and k, P is its definition's over all three;
    where the last one's call brought none (a sum of two samples' q and k, divided as if of three, is no P), P is not
    stored, and the layer's note says why."""
    from biasviz.adapters.rows import RowBlock
    from biasviz.summaries.streamed_position import SOME_OPERANDS_NOTE, StreamedPosition

    heads, t, hd, n, c = 2, 6, 4, 3, 0.5
    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((2, n, heads, t, hd))
    i, j = np.indices((t, t))
    scores = c * np.einsum("ahid,ahjd->ahij", q, k)
    scores = np.where(j <= i, scores, np.nan)
    weights = np.where(j <= i, 1.0 / (i + 1), 0.0)[None, None].repeat(n, 0).repeat(heads, 1)
    for given in (n, n - 1):
        spot = StreamedPosition(0, heads=heads, seq_len=t, samples=n, block=1, causal=True,
                                device=torch.device("cpu"), measures=False)  # fmt: skip
        for a in range(n):
            spot.begin_batch(1)
            operands = {"q": torch.from_numpy(q[a : a + 1]), "k": torch.from_numpy(c * k[a : a + 1]),
                        "scale": c} if a < given else {}  # fmt: skip
            spot.add_block(RowBlock(0, a, 0, torch.from_numpy(weights[a : a + 1]),
                                    scores=torch.from_numpy(scores[a : a + 1]).float(), **operands))  # fmt: skip
        got = spot.result()
        if given == n:
            want = np.where(j <= i, positional(q, k, c, None), np.nan)
            np.testing.assert_allclose(got.positional_mean, want, **TOL)
            assert got.note is None
        else:
            assert got.positional_mean is None and got.positional_profile is None
            assert got.note == SOME_OPERANDS_NOTE
