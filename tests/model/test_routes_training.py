"""Which route a CPU training step takes: attention whose every cell fits in one of the recomputation's blocks is
kept whole (every cell at once, as GPT-2 does: the recomputation would form the same cells again and keep no less);
larger attention is recomputed block by block. Both give the gradients of the full-matrix formula."""

from __future__ import annotations

import torch

from biasviz.model import BiasGPTConfig, BiasGPTForCausalLM, blocked_grad, fused


def _step(t: int, windows: int, scheme: str = "kerple-log") -> tuple[dict[str, int], dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    config = BiasGPTConfig(scheme=scheme, n_layer=1, n_head=4, n_embd=32, vocab_size=97, n_positions=2048)
    model = BiasGPTForCausalLM(config).train()
    ids = torch.randint(1, 97, (windows, t), generator=torch.Generator().manual_seed(1))
    fused.forget_routes()
    model(ids, labels=ids).loss.backward()
    return fused.routes_taken(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _full_matrix_grads(t: int, windows: int, scheme: str = "kerple-log") -> dict[str, torch.Tensor]:
    """The same step with the scores, bias, mask and softmax written out by autograd (independent of both routes)."""
    torch.manual_seed(0)
    config = BiasGPTConfig(scheme=scheme, n_layer=1, n_head=4, n_embd=32, vocab_size=97, n_positions=2048)
    model = BiasGPTForCausalLM(config).train()
    ids = torch.randint(1, 97, (windows, t), generator=torch.Generator().manual_seed(1))
    attn = model.blocks[0].attn

    def full(x, q, k, v):
        T = x.shape[1]
        scores = (q @ k.transpose(-2, -1)) * attn.scale + attn.pos_bias(x, T, T)
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(scores, dim=-1) @ v

    attn._full = full
    model(ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_attention_in_one_block_is_kept_whole_and_larger_is_recomputed(monkeypatch) -> None:
    monkeypatch.setenv("BIASVIZ_ATTENTION", "auto")
    small = (64, 2)  # 2 x 4 x 64 x 64 cells: one block
    monkeypatch.setattr(blocked_grad, "BLOCK_ELEMENTS", 2 * 4 * 64 * 64)
    routes, grads = _step(*small)
    assert routes == {"dense": 1}
    routes_big, grads_big = _step(96, 2)  # over the (lowered) block: recomputed
    assert routes_big == {"blocked-grad": 1}
    for (t, w), got in (((64, 2), grads), ((96, 2), grads_big)):
        ref = _full_matrix_grads(t, w)
        assert got.keys() == ref.keys()
        for name, g in ref.items():
            assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-6), name
