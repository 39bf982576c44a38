"""Training attention by blocked recomputation against autograd through the full matrix.

The custom backward (FlashAttention-2's recomputation with the bias's own gradient) must give the gradients
autograd gives through softmax(scale q k^T + b) v formed cell by cell in float64; and a model of every scheme
must train with it to the same loss and parameter gradients as through the full-matrix path.
"""

from __future__ import annotations

import pytest
import torch

from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, blocked_grad
from biasviz.schemes import SCHEMES
from biasviz.schemes.base import ScoreTerms

T = 300


@pytest.fixture(autouse=True)
def _recomputed(monkeypatch) -> None:
    """These tests are about the recomputation: their small models take it too (a CPU otherwise keeps attention
    that fits in one block whole, tests/model/test_routes_training.py)."""
    monkeypatch.setattr(blocked_grad, "one_block", lambda q: False)


@pytest.mark.parametrize("form", ["distance", "ends"])
def test_gradients_equal_autograd_in_float64(form: str, monkeypatch) -> None:
    monkeypatch.setattr(blocked_grad, "BLOCK_ELEMENTS", 1 << 15)  # many blocks of rows
    g = torch.Generator().manual_seed(0)
    B, H, hd = 2, 3, 16
    q, k, v = (torch.randn(B, H, T, hd, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    compact = torch.randn((H, 2 * T - 1) if form == "distance" else (B, H, T), generator=g, dtype=torch.float64,
                          requires_grad=True)  # fmt: skip
    upstream = torch.randn(B, H, T, hd, generator=g, dtype=torch.float64)
    terms = ScoreTerms(distance=compact) if form == "distance" else ScoreTerms(ends=compact)
    out = blocked_grad.attend(q, k, v, terms, 0.25)
    grads = torch.autograd.grad(out, (q, k, v, compact), upstream)
    i = torch.arange(T)
    if form == "distance":  # entry T - 1 - (i - j), read cell by cell
        bias = compact[:, T - 1 - (i[:, None] - i[None, :])]
    else:
        bias = compact[:, :, :, None] - compact[:, :, None, :]
    scores = (q @ k.transpose(-2, -1)) * 0.25 + bias
    reference = torch.softmax(scores.masked_fill(i[None, :] > i[:, None], float("-inf")), dim=-1) @ v
    expected = torch.autograd.grad(reference, (q, k, v, compact), upstream)
    assert (out - reference).abs().max() <= 1e-5 * reference.abs().max()
    for got, want in zip(grads, expected, strict=True):
        assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def _step(scheme: str, mode: str, monkeypatch, *, t: int = T, layers: int = 2, width: int = 64,
          windows: int = 2) -> tuple[float, dict[str, torch.Tensor]]:  # fmt: skip
    """One training step of a model whose bias's parameters are moved off their initial values: its loss and
    every parameter's gradient (``windows`` of ``t`` tokens, the second padded at its end)."""
    monkeypatch.setenv("BIASVIZ_ATTENTION", mode)
    torch.manual_seed(0)
    config = BiasGPTConfig(scheme=scheme, n_layer=layers, n_head=4, n_embd=width, vocab_size=97, n_positions=512)
    model = BiasGPTForCausalLM(config).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "pos_bias" in name:
                p.add_(0.3 * torch.randn_like(p))
    ids = torch.randint(1, 97, (windows, t), generator=torch.Generator().manual_seed(1))
    ids[1:, t - 60 :] = 0  # a padded window
    loss = model(ids, labels=ids).loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_training_step_equals_full_matrix_path(scheme: str, monkeypatch) -> None:
    loss, grads = _step(scheme, "auto", monkeypatch)
    loss_full, grads_full = _step(scheme, "sdpa", monkeypatch)
    assert abs(loss - loss_full) <= 1e-5 * abs(loss_full)
    assert grads.keys() == grads_full.keys()
    for name, g in grads_full.items():
        assert (grads[name] - g).abs().max() <= 1e-4 * max(g.abs().max().item(), 1e-6), name


def test_no_weights_kept_for_the_backward(monkeypatch) -> None:
    """What autograd keeps for one layer's backward grows with T, not T^2: no saved tensor has T x T cells."""
    monkeypatch.setenv("BIASVIZ_ATTENTION", "auto")
    config = BiasGPTConfig(scheme="t5", n_layer=1, n_head=4, n_embd=64, vocab_size=97)
    model = BiasGPTForCausalLM(config).train()
    n = 1024
    saved: list[torch.Size] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.shape)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(torch.randint(0, 97, (1, n))).logits.sum().backward()
    assert saved and max(s.numel() for s in saved) < n * n  # the largest: logits (n x 97) and the MLP's (n x 256)
