"""Training attention that keeps no (query, key) cell for the backward pass: FlashAttention-2's recomputation,
one block of query rows at a time, with the bias's own gradient.

Autograd through ``softmax(scale q k^T + b) v`` keeps the (B, H, T, T) weights of every layer until the
backward pass (and torch's fused CPU kernel takes no gradient for a mask, so a learned bias falls back to that
unfused path). Here the forward keeps q, k, v, the output and one log-sum-exp per row; the backward forms each
block of rows again and returns dq, dk, dv and the gradient of the bias's compact form
(:class:`~biasviz.schemes.base.ScoreTerms`): a distance table (each cell's gradient added to the entry of its
distance i - j) or the per-position values of b = s_i - s_j (row sums minus column sums). Memory per layer is
O(B * H * T * d) plus one block; the arithmetic is that of the eager path (Dao, "FlashAttention-2", 2023, Alg. 2).
"""

from __future__ import annotations

import torch

from biasviz.model.attention import attention_scores, causal_mask, query_blocks
from biasviz.schemes.base import ScoreTerms

BLOCK_ELEMENTS = 1 << 22  # scores per block (B * H * rows * keys): 16 MiB of float32, a few temporaries of it


def one_block(q: torch.Tensor) -> bool:
    """Whether every (query, key) cell of ``q``'s attention, (B, H, T, hd) causal, fits in one block: then the
    recomputation saves no memory over keeping the cells for the backward pass, and only costs a second forward."""
    B, H, T, _ = q.shape
    return B * H * T * T <= BLOCK_ELEMENTS


def _masked_scores(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float, r0: int) -> torch.Tensor:
    """scale q k^T + b of one causal block of rows, -inf past the diagonal, float32: (B, H, rows, r1)."""
    scores = attention_scores(q, k, bias, scale)
    rows = q.shape[-2]
    scores[..., r0:].masked_fill_(causal_mask(rows, rows, q.device), float("-inf"))
    return scores


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, table, ends, scale: float):  # noqa: ANN001, ANN205 - autograd's signature
        terms = ScoreTerms(distance=table, ends=ends)
        B, H, T, hd = q.shape
        out = torch.empty_like(v)
        lse = torch.empty(B, H, T, dtype=torch.float32, device=q.device)
        for r0, r1 in query_blocks(T, B * H, BLOCK_ELEMENTS):
            scores = _masked_scores(q[:, :, r0:r1], k[:, :, :r1], terms.rows(r0, r1), scale, r0)
            lse[:, :, r0:r1] = torch.logsumexp(scores, dim=-1)
            weights = torch.softmax(scores, dim=-1, out=scores)
            out[:, :, r0:r1] = (weights @ v[:, :, :r1].float()).to(v.dtype)
        ctx.save_for_backward(q, k, v, table, ends, out, lse)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out):  # noqa: ANN001, ANN205
        q, k, v, table, ends, out, lse = ctx.saved_tensors
        scale = ctx.scale
        terms = ScoreTerms(distance=table, ends=ends)
        B, H, T, hd = q.shape
        grad_out = grad_out.float()
        delta = (grad_out * out.float()).sum(-1)  # (B, H, T): rowsum(dO * O) = rowsum(P * dP)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = torch.zeros_like(dq), torch.zeros_like(dq)
        d_table = None if table is None else torch.zeros(table.shape, dtype=torch.float32, device=q.device)
        d_ends = None if ends is None else torch.zeros(ends.shape, dtype=torch.float32, device=q.device)
        for r0, r1 in query_blocks(T, B * H, BLOCK_ELEMENTS):
            q_b, k_b, v_b = q[:, :, r0:r1].float(), k[:, :, :r1].float(), v[:, :, :r1].float()
            do_b = grad_out[:, :, r0:r1]
            scores = _masked_scores(q_b, k_b, terms.rows(r0, r1), scale, r0)
            weights = torch.exp(scores.sub_(lse[:, :, r0:r1, None]))  # (B, H, rows, r1); 0 past the diagonal
            dv[:, :, :r1] += weights.transpose(-2, -1) @ do_b
            d_scores = weights.mul_((do_b @ v_b.transpose(-2, -1)).sub_(delta[:, :, r0:r1, None]))  # dS
            dq[:, :, r0:r1] = (d_scores @ k_b) * scale
            dk[:, :, :r1] += (d_scores.transpose(-2, -1) @ q_b) * scale
            if d_table is not None:  # cell (i, j) came from entry T - 1 - (i - j)
                rows = r1 - r0
                first = T - 1 - torch.arange(r0, r1, device=q.device)  # (rows,): the entry of key 0 in each row
                index = (first[:, None] + torch.arange(r1, device=q.device)[None, :]).reshape(-1)  # (rows * r1,)
                summed = d_scores.sum(0) if d_scores.shape[0] > 1 else d_scores[0]  # (H, rows, r1)
                d_table.index_add_(1, index, summed.reshape(H, rows * r1))
            if d_ends is not None:  # b = s_i - s_j: + row sums at the queries, - column sums at the keys
                d_ends[:, :, r0:r1] += d_scores.sum(-1)
                d_ends[:, :, :r1] -= d_scores.sum(-2)
        cast = (lambda g, t: None if t is None or not t.requires_grad else g.to(t.dtype))  # noqa: E731
        return cast(dq, q), cast(dk, k), cast(dv, v), cast(d_table, table), cast(d_ends, ends), None


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, terms: ScoreTerms, scale: float) -> torch.Tensor:
    """Causal softmax(scale q k^T + b) v, differentiable in q, k, v and the terms: (B, H, T, hd) each."""
    return _Attention.apply(q, k, v, terms.distance, terms.ends, scale)
