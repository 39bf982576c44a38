"""Attention arithmetic shared by the model's two paths: the causal mask, the softmax, and query blocks.

Training (autograd) forms every (query, key) cell at once; extraction and evaluation form one block of
query rows at a time (:func:`query_blocks`), so that no (H, T, T) tensor ever exists: at T = 65536 one
would take 206 GB. A causal block of queries r0..r1-1 sees keys 0..r1-1 only; within it, key j > query i
is masked, and those cells lie in the block's last ``r1 - r0`` columns (:func:`causal_mask` of the square).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

# Scores per query block, counted over batch, heads, rows and keys (B * H * rows * r1):
BLOCK_ELEMENTS = 1 << 20  # CPU: 4 MiB of float32 (measured fastest on 2 cores: 2^18 and 2^22 are slower)
CUDA_BLOCK_ELEMENTS = 1 << 26  # CUDA: 256 MiB of float32; few, large kernels
# A block passed to SDPA with its bias as a mask: each call has a fixed cost, so a block near query 16K of the
# 4 MiB budget (5 rows) is thousands of calls; at least MIN_ROWS rows (measured fastest at T = 4096-8192 on 2
# cores: 64 rows 2.1-2.3x the causal kernel, the 4 MiB budget 2.5-2.8x), unless that takes over SDPA_BLOCK_CAP.
MIN_ROWS = 64
SDPA_BLOCK_CAP = 1 << 26


def causal_mask(q_len: int, k_len: int, device: torch.device) -> torch.Tensor:
    """True where key j lies after query i (cells the causal mask removes), (Tq, Tk).

    Queries are the last ``q_len`` of ``k_len`` positions, so ``causal_mask(r1 - r0, r1)`` is the mask of
    the query block r0..r1-1 and ``causal_mask(rows, rows)`` its trailing square.
    """
    i = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    return torch.arange(k_len, device=device)[None, :] > i


def block_budget(device: torch.device, elements: int | None = None) -> int:
    """Scores per query block: ``elements`` when given, else the device's default."""
    if elements is not None:
        return max(1, int(elements))
    return CUDA_BLOCK_ELEMENTS if device.type == "cuda" else BLOCK_ELEMENTS


def query_blocks(q_len: int, per_cell: int, budget: int) -> Iterator[tuple[int, int]]:
    """``(r0, r1)`` blocks of causal query rows covering 0..q_len-1, each with ``per_cell * rows * r1 <= budget``.

    ``per_cell`` counts the scores one (query, key) cell costs (batch x heads). Early blocks see few keys,
    so they take more rows: the number of blocks is about half that of equal-sized ones. Every block
    has at least one row, whatever the budget.

    >>> list(query_blocks(5, per_cell=1, budget=6))
    [(0, 2), (2, 3), (3, 4), (4, 5)]
    """
    cells = max(1, budget // max(per_cell, 1))  # rows * r1 allowed per block
    r0 = 0
    while r0 < q_len:
        rows = int((math.sqrt(r0 * r0 + 4 * cells) - r0) / 2)  # rows * (r0 + rows) <= cells
        while rows > 1 and rows * (r0 + rows) > cells:  # guard the float square root
            rows -= 1
        while (rows + 1) * (r0 + rows + 1) <= cells:
            rows += 1
        r1 = min(q_len, r0 + max(1, rows))
        yield r0, r1
        r0 = r1


def attention_pattern(
    q: torch.Tensor,
    k: torch.Tensor,
    bias: torch.Tensor | None,
    masked: torch.Tensor | None,
    scale: float | None = None,
) -> torch.Tensor:
    """softmax(scale * q k^T + bias) over keys, in float32: (B, H, Tq, Tk).

    ``scale`` None is 1/sqrt(d_head). ``masked`` (Tq, m) is True where a key must be ignored and applies
    to the *last* m keys: m = Tk is a whole mask, m = Tq the trailing square of a causal query block
    (the only columns such a block masks); None attends everywhere. Without autograd the scores are
    biased, masked and normalised in one buffer; with it, by the differentiable out-of-place formula.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    tracked = (q, k) if bias is None else (q, k, bias)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tracked)
    Tk = k.shape[-2]
    if grad:
        scores = (q.float() @ k.float().transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
        if bias is not None:
            scores = scores + bias.float()
        if masked is not None:
            if masked.shape[-1] < Tk:  # a trailing mask: nothing masked in the leading keys
                lead = torch.zeros(*masked.shape[:-1], Tk - masked.shape[-1], dtype=torch.bool, device=masked.device)
                masked = torch.cat([lead, masked], dim=-1)
            scores = scores.masked_fill(masked, float("-inf"))
        return torch.softmax(scores, dim=-1)
    return masked_softmax_(attention_scores(q, k, bias, scale), masked)


def attention_scores(q: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None, scale: float) -> torch.Tensor:
    """The softmax's input without autograd, scale * q k^T + bias in float32, (B, H, Tq, Tk): a new tensor."""
    scores = (q.float() * scale) @ k.float().transpose(-2, -1)  # q is the smaller operand
    if bias is not None:
        scores.add_(bias.float())
    return scores


def masked_softmax_(scores: torch.Tensor, masked: torch.Tensor | None) -> torch.Tensor:
    """softmax over keys of ``scores`` in place, -inf first where ``masked`` (Tq, m) marks the last m keys."""
    if masked is not None:
        scores[..., scores.shape[-1] - masked.shape[-1] :].masked_fill_(masked, float("-inf"))
    return torch.softmax(scores, dim=-1, out=scores)


def masked_softmax(scores: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """:func:`masked_softmax_` into a new tensor, ``scores`` left as they were: only the masked last m columns are
    set aside and put back, not the whole block copied (a pass over the block less; the same arithmetic). For
    scores the caller owns: they are written to for a moment (not for a tensor a hook returned)."""
    tail = scores[..., scores.shape[-1] - masked.shape[-1] :]
    kept = tail.clone()
    tail.masked_fill_(masked, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    tail.copy_(kept)
    return weights


def sdpa_mask(bias: torch.Tensor, r0: int, r1: int, dtype: torch.dtype, owned: bool) -> torch.Tensor:
    """The ``attn_mask`` of SDPA for the causal query block r0..r1-1 against keys 0..r1-1: the bias block
    in ``dtype`` with -inf where key j > query i, (1 or B, H, rows, r1).

    ``owned`` says the bias block may be overwritten (no hook holds it). SDPA's own ``is_causal`` aligns
    top-left, which is wrong for a block with r0 > 0, so the mask is written here.
    """
    mask = bias.to(dtype)
    if mask is bias and not owned:
        mask = mask.clone()
    square = causal_mask(r1 - r0, r1 - r0, bias.device)  # (rows, rows): the block's only masked columns
    mask[..., r0:r1].masked_fill_(square, float("-inf"))  # (1 or B, H, rows, r1)
    return mask
